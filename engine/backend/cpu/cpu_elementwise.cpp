// Elementwise ops, bias, reductions and the optimizer updates on the CPU.
// Arithmetic is in acc_t<T> (float for fp32/bf16/fp16, double for fp64); formulas follow
// PyTorch's CPU kernels so fp32 results agree to rounding.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_threads.h"

namespace ptool {

namespace {

template <class A>
A act_forward(Activation act, A x) {
    switch (act) {
        case Activation::relu:
            return x > A(0) || x != x ? x : A(0);  // NaN stays NaN, as torch.relu
        case Activation::gelu:
            return A(0.5) * x * (A(1) + std::erf(x * A(M_SQRT1_2)));
        case Activation::gelu_tanh: {
            const A beta = A(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = A(0.044715);
            return A(0.5) * x * (A(1) + std::tanh(beta * (x + kappa * x * x * x)));
        }
        case Activation::silu:
            return x / (A(1) + std::exp(-x));
        case Activation::tanh:
            return std::tanh(x);
    }
    return x;
}

template <class A>
A act_derivative(Activation act, A x) {
    switch (act) {
        case Activation::relu:
            return x <= A(0) ? A(0) : A(1);  // threshold_backward: NaN passes the gradient
        case Activation::gelu: {
            const A cdf = A(0.5) * (A(1) + std::erf(x * A(M_SQRT1_2)));
            const A pdf = std::exp(A(-0.5) * x * x) * A(M_2_SQRTPI * M_SQRT1_2 * 0.5);
            return cdf + x * pdf;
        }
        case Activation::gelu_tanh: {
            const A beta = A(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = A(0.044715);
            const A x_sq = x * x;
            const A t = std::tanh(beta * (x + kappa * x_sq * x));
            const A right = A(1) + t;
            const A right_derivative = (A(1) - t * t) * beta * (A(1) + A(3) * kappa * x_sq);
            return A(0.5) * right + A(0.5) * x * right_derivative;
        }
        case Activation::silu: {
            const A s = A(1) / (A(1) + std::exp(-x));
            return s * (A(1) + x * (A(1) - s));
        }
        case Activation::tanh: {
            const A t = std::tanh(x);
            return A(1) - t * t;
        }
    }
    return A(1);
}

// out[i] = f(a[i], b[i]) over floating tensors of one dtype.
template <class F>
void binary(const Tensor& a, const Tensor& b, Tensor& out, const char* op, F f) {
    require_same_shape(a, b, op);
    require_same_shape(a, out, op);
    require_same_dtype(a, b, op);
    require_same_dtype(a, out, op);
    dispatch_float(a.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *pa = a.data<T>(), *pb = b.data<T>();
        T* po = out.data<T>();
        cpu_for(a.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) po[i] = T(f(A(pa[i]), A(pb[i])));
        });
    });
}

}  // namespace

void CpuBackend::activation(Activation act, const Tensor& x, Tensor& y) {
    binary(x, x, y, "activation", [act](auto v, auto) { return act_forward(act, v); });
}

void CpuBackend::activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
    binary(x, dy, dx, "activation_backward", [act](auto v, auto g) { return g * act_derivative(act, v); });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
    binary(a, b, out, "add", [](auto u, auto v) { return u + v; });
}

void CpuBackend::mul(const Tensor& a, const Tensor& b, Tensor& out) {
    binary(a, b, out, "mul", [](auto u, auto v) { return u * v; });
}

void CpuBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
    binary(y, x, y, "axpy", [alpha](auto u, auto v) { return u + decltype(u)(alpha) * v; });
}

void CpuBackend::scale(const Tensor& x, double s, Tensor& out) {
    binary(x, x, out, "scale", [s](auto u, auto) { return u * decltype(u)(s); });
}

void CpuBackend::gated_activation(Activation act, const Tensor& g, const Tensor& u, Tensor& a, Tensor& h) {
    for (const Tensor* t : std::initializer_list<const Tensor*>{&u, &a, &h})
        require_same_shape(g, *t, "gated_activation"), require_same_dtype(g, *t, "gated_activation");
    dispatch_float(g.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *pg = g.data<T>(), *pu = u.data<T>();
        T *pa = a.data<T>(), *ph = h.data<T>();
        cpu_for(g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const T ai = T(act_forward(act, A(pg[i])));
                pa[i] = ai;
                ph[i] = T(A(ai) * A(pu[i]));
            }
        });
    });
}

void CpuBackend::gated_activation_backward(Activation act, const Tensor& g, const Tensor& a, const Tensor& u,
                                           const Tensor& dh, Tensor& du, Tensor& dg) {
    for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &u, &dh, &du, &dg})
        require_same_shape(g, *t, "gated_activation_backward"),
            require_same_dtype(g, *t, "gated_activation_backward");
    dispatch_float(g.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *pg = g.data<T>(), *pa = a.data<T>(), *pu = u.data<T>(), *pdh = dh.data<T>();
        T *pdu = du.data<T>(), *pdg = dg.data<T>();
        cpu_for(g.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                pdu[i] = T(A(pdh[i]) * A(pa[i]));
                const T da = T(A(pdh[i]) * A(pu[i]));
                pdg[i] = T(A(da) * act_derivative(act, A(pg[i])));
            }
        });
    });
}

void CpuBackend::fill(Tensor& t, double value) {
    dispatch_float(t.dtype(), [&](auto tag) {
        using T = decltype(tag);
        T* p = t.data<T>();
        const T v = T(static_cast<acc_t<T>>(value));
        cpu_for(t.numel(), kElementGrain,
                [&](int64_t begin, int64_t end) { std::fill(p + begin, p + end, v); });
    });
}

void CpuBackend::copy(const Tensor& src, Tensor& dst) {
    require_same_shape(src, dst, "copy");
    if (src.dtype() == dst.dtype()) {
        std::memcpy(dst.raw(), src.raw(), src.nbytes());
        return;
    }
    if (!dtype_is_float(src.dtype()) || !dtype_is_float(dst.dtype())) {
        for (int64_t i = 0, n = src.numel(); i < n; ++i) dst.set(i, src.item(i));
        return;
    }
    dispatch_float(src.dtype(), [&](auto s) {  // mixed precision's casts: one typed loop
        dispatch_float(dst.dtype(), [&](auto d) {
            using S = decltype(s);
            using D = decltype(d);
            const S* ps = src.data<S>();
            D* pd = dst.data<D>();
            cpu_for(src.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) pd[i] = D(static_cast<acc_t<S>>(ps[i]));
            });
        });
    });
}

void CpuBackend::add_bias(Tensor& y, const Tensor& bias) {
    const int64_t n = bias.numel(), rows = n == 0 ? 0 : y.numel() / n;
    PTOOL_REQUIRE(y.size(-1) == n, "add_bias: y {} bias {}", shape_str(y.shape()), shape_str(bias.shape()));
    dispatch_float(y.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        T* py = y.data<T>();
        const T* pb = bias.data<T>();
        cpu_for(rows, std::max<int64_t>(1, kElementGrain / std::max<int64_t>(n, 1)),
                [&](int64_t begin, int64_t end) {
                    for (int64_t r = begin; r < end; ++r)
                        for (int64_t j = 0; j < n; ++j) py[r * n + j] = T(A(py[r * n + j]) + A(pb[j]));
                });
    });
}

void CpuBackend::sum_rows(const Tensor& dy, Tensor& db, bool acc) {
    const int64_t n = db.numel(), rows = n == 0 ? 0 : dy.numel() / n;
    PTOOL_REQUIRE(dy.size(-1) == n, "sum_rows: dy {} db {}", shape_str(dy.shape()), shape_str(db.shape()));
    dispatch_float(dy.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* pd = dy.data<T>();
        T* pb = db.data<T>();
        std::vector<double> s(n, 0.0);  // row-major walk: contiguous reads
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < n; ++j) s[j] += static_cast<double>(acc_t<T>(pd[r * n + j]));
        for (int64_t j = 0; j < n; ++j)
            pb[j] = T(static_cast<acc_t<T>>(s[j] + (acc ? static_cast<double>(acc_t<T>(pb[j])) : 0.0)));
    });
}

double CpuBackend::sum_all(const Tensor& x) {
    return dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* p = x.data<T>();
        double s = 0.0;
        for (int64_t i = 0, n = x.numel(); i < n; ++i) s += static_cast<double>(acc_t<T>(p[i]));
        return s;
    });
}

// torch.optim.SGD (foreach=False): d_p = g + wd * p; buf = d_p on the first step, else
// momentum * buf + d_p (dampening 0); p -= lr * buf.
void CpuBackend::sgd_step(Tensor& p, const Tensor& g, Tensor& buf, double lr, double momentum,
                          double weight_decay, bool first_step) {
    require_same_shape(p, g, "sgd_step");
    dispatch_float(p.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        T* pp = p.data<T>();
        const T* pg = g.data<T>();
        T* pm = momentum != 0.0 ? buf.data<T>() : nullptr;
        cpu_for(p.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                A d = A(pg[i]);
                if (weight_decay != 0.0) d = d + A(weight_decay) * A(pp[i]);
                if (pm) {
                    A m = first_step ? d : A(momentum) * A(pm[i]) + d;
                    pm[i] = T(m);
                    d = A(pm[i]);
                }
                pp[i] = T(A(pp[i]) - A(lr) * d);
            }
        });
    });
}

// torch.optim.AdamW (single-tensor path): p *= 1 - lr*wd; m = lerp(m, g, 1-b1);
// v = b2*v + (1-b2)*g*g; denom = sqrt(v)/sqrt(bc2) + eps; p -= (lr/bc1) * m/denom.
void CpuBackend::adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, int64_t step, double lr,
                            double beta1, double beta2, double eps, double weight_decay) {
    require_same_shape(p, g, "adamw_step");
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step)));
    const double step_size = lr / bc1;
    dispatch_float(p.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        T *pp = p.data<T>(), *pm = m.data<T>(), *pv = v.data<T>();
        const T* pg = g.data<T>();
        cpu_for(p.numel(), kElementGrain, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const A gi = A(pg[i]);
                A pi = A(pp[i]) * A(1.0 - lr * weight_decay);
                A mi = A(pm[i]) + A(1.0 - beta1) * (gi - A(pm[i]));
                A vi = A(pv[i]) * A(beta2) + A(1.0 - beta2) * gi * gi;
                pm[i] = T(mi);
                pv[i] = T(vi);
                const A denom = std::sqrt(A(pv[i])) / A(bc2_sqrt) + A(eps);
                pp[i] = T(pi - A(step_size) * (A(pm[i]) / denom));
            }
        });
    });
}

}  // namespace ptool
