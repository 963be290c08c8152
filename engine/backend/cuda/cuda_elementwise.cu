// Elementwise ops, bias, reductions and the optimizer updates on the GPU. The formulas are the
// CPU backend's (cpu_elementwise.cpp), in the same accumulate type; column sums walk rows in
// order in double, as the CPU does, so sum_rows agrees bitwise with it.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ptool {
namespace {
using namespace ptool::cuda;

template <class A>
__device__ A act_forward(Activation act, A x) {
    switch (act) {
        case Activation::relu:
            return x > A(0) || x != x ? x : A(0);  // NaN stays NaN, as torch.relu
        case Activation::gelu:
            return A(0.5) * x * (A(1) + erf(x * A(M_SQRT1_2)));
        case Activation::gelu_tanh: {
            const A beta = A(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = A(0.044715);
            return A(0.5) * x * (A(1) + tanh(beta * (x + kappa * x * x * x)));
        }
        case Activation::silu:
            return x / (A(1) + exp(-x));
        case Activation::tanh:
            return tanh(x);
    }
    return x;
}

template <class A>
__device__ A act_derivative(Activation act, A x) {
    switch (act) {
        case Activation::relu:
            return x <= A(0) ? A(0) : A(1);  // threshold_backward: NaN passes the gradient
        case Activation::gelu: {
            const A cdf = A(0.5) * (A(1) + erf(x * A(M_SQRT1_2)));
            const A pdf = exp(A(-0.5) * x * x) * A(M_2_SQRTPI * M_SQRT1_2 * 0.5);
            return cdf + x * pdf;
        }
        case Activation::gelu_tanh: {
            const A beta = A(M_SQRT2 * M_2_SQRTPI * 0.5), kappa = A(0.044715);
            const A x_sq = x * x;
            const A t = tanh(beta * (x + kappa * x_sq * x));
            const A right = A(1) + t;
            const A right_derivative = (A(1) - t * t) * beta * (A(1) + A(3) * kappa * x_sq);
            return A(0.5) * right + A(0.5) * x * right_derivative;
        }
        case Activation::silu: {
            const A s = A(1) / (A(1) + exp(-x));
            return s * (A(1) + x * (A(1) - s));
        }
        case Activation::tanh: {
            const A t = tanh(x);
            return A(1) - t * t;
        }
    }
    return A(1);
}

enum class BinOp { act, act_backward, add, mul, axpy, scale };

template <class D>
__global__ void binary_kernel(BinOp op, Activation act, double s, const D* a, const D* b, D* out, int64_t n) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, n) {
        const A u = to_acc(a[i]), v = to_acc(b[i]);
        A r;
        switch (op) {
            case BinOp::act:
                r = act_forward(act, u);
                break;
            case BinOp::act_backward:
                r = v * act_derivative(act, u);
                break;
            case BinOp::add:
                r = u + v;
                break;
            case BinOp::mul:
                r = u * v;
                break;
            case BinOp::axpy:
                r = u + A(s) * v;
                break;
            default:
                r = u * A(s);
                break;
        }
        out[i] = from_acc<D>(r);
    }
}

void binary(BinOp op, Activation act, double s, const Tensor& a, const Tensor& b, Tensor& out,
            const char* name) {
    require_same_shape(a, b, name);
    require_same_shape(a, out, name);
    require_same_dtype(a, b, name);
    require_same_dtype(a, out, name);
    const Launch l = elementwise_launch(a.numel(), sm_count());
    if (!l.grid) return;
    dispatch(a.dtype(), [&](auto tag) {
        using D = decltype(tag);
        binary_kernel<D>
            <<<l.grid, l.block, 0, stream()>>>(op, act, s, ptr<D>(a), ptr<D>(b), ptr<D>(out), a.numel());
    });
    check_launch();
}

// a = act(g), h = a * u; and backward du = dh * a, dg = (dh * u) act'(g): binary_kernel's formulas
// with its roundings (each product rounded to the dtype where the unfused ops store it)
template <class D>
__global__ void gated_kernel(Activation act, const D* g, const D* u, D* a, D* h, int64_t n) {
    PTOOL_GRID_STRIDE(i, n) {
        const D ai = from_acc<D>(act_forward(act, to_acc(g[i])));
        a[i] = ai;
        h[i] = from_acc<D>(to_acc(ai) * to_acc(u[i]));
    }
}

template <class D>
__global__ void gated_backward_kernel(Activation act, const D* g, const D* a, const D* u, const D* dh, D* du,
                                      D* dg, int64_t n) {
    PTOOL_GRID_STRIDE(i, n) {
        du[i] = from_acc<D>(to_acc(dh[i]) * to_acc(a[i]));
        const D da = from_acc<D>(to_acc(dh[i]) * to_acc(u[i]));
        dg[i] = from_acc<D>(to_acc(da) * act_derivative(act, to_acc(g[i])));
    }
}

template <class D>
__global__ void fill_kernel(D* p, dacc_t<D> v, int64_t n) {
    const D x = from_acc<D>(v);
    PTOOL_GRID_STRIDE(i, n) p[i] = x;
}

template <class S, class D>
__global__ void convert_kernel(const S* src, D* dst, int64_t n) {
    PTOOL_GRID_STRIDE(i, n) dst[i] = from_acc<D>(static_cast<dacc_t<D>>(to_acc(src[i])));
}

template <class D>
__global__ void add_bias_kernel(D* y, const D* bias, int64_t rows, int64_t n) {
    PTOOL_GRID_STRIDE(i, rows * n) y[i] = from_acc<D>(to_acc(y[i]) + to_acc(bias[i % n]));
}

template <class D>
__global__ void sum_rows_kernel(const D* dy, D* db, int64_t rows, int64_t n, bool acc) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(j, n) {
        double s = 0.0;
        for (int64_t r = 0; r < rows; ++r) s += static_cast<double>(to_acc(dy[r * n + j]));
        db[j] = from_acc<D>(static_cast<A>(s + (acc ? static_cast<double>(to_acc(db[j])) : 0.0)));
    }
}

template <class D>
__global__ void sum_all_kernel(const D* x, int64_t n, double* out) {  // one block: a fixed order
    __shared__ double scratch[32];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(to_acc(x[i]));
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) *out = s;
}

template <class D>
__global__ void sgd_kernel(D* p, const D* g, D* buf, int64_t n, double lr, double momentum, double wd,
                           bool first) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, n) {
        A d = to_acc(g[i]);
        if (wd != 0.0) d = d + A(wd) * to_acc(p[i]);
        if (buf) {
            const A m = first ? d : A(momentum) * to_acc(buf[i]) + d;
            buf[i] = from_acc<D>(m);
            d = to_acc(buf[i]);
        }
        p[i] = from_acc<D>(to_acc(p[i]) - A(lr) * d);
    }
}

template <class D>
__global__ void adamw_kernel(D* p, const D* g, D* m, D* v, int64_t n, double lr, double beta1, double beta2,
                             double eps, double wd, double step_size, double bc2_sqrt) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, n) {
        const A gi = to_acc(g[i]);
        const A pi = to_acc(p[i]) * A(1.0 - lr * wd);
        const A mi = to_acc(m[i]) + A(1.0 - beta1) * (gi - to_acc(m[i]));
        const A vi = to_acc(v[i]) * A(beta2) + A(1.0 - beta2) * gi * gi;
        m[i] = from_acc<D>(mi);
        v[i] = from_acc<D>(vi);
        const A denom = sqrt(to_acc(v[i])) / A(bc2_sqrt) + A(eps);
        p[i] = from_acc<D>(pi - A(step_size) * (to_acc(m[i]) / denom));
    }
}

}  // namespace

void CudaBackend::activation(Activation act, const Tensor& x, Tensor& y) {
    binary(BinOp::act, act, 0, x, x, y, "activation");
}
void CudaBackend::activation_backward(Activation act, const Tensor& x, const Tensor& dy, Tensor& dx) {
    binary(BinOp::act_backward, act, 0, x, dy, dx, "activation_backward");
}
void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
    binary(BinOp::add, Activation::relu, 0, a, b, out, "add");
}
void CudaBackend::mul(const Tensor& a, const Tensor& b, Tensor& out) {
    binary(BinOp::mul, Activation::relu, 0, a, b, out, "mul");
}
void CudaBackend::axpy(double alpha, const Tensor& x, Tensor& y) {
    binary(BinOp::axpy, Activation::relu, alpha, y, x, y, "axpy");
}
void CudaBackend::scale(const Tensor& x, double s, Tensor& out) {
    binary(BinOp::scale, Activation::relu, s, x, x, out, "scale");
}

void CudaBackend::gated_activation(Activation act, const Tensor& g, const Tensor& u, Tensor& a, Tensor& h) {
    for (const Tensor* t : std::initializer_list<const Tensor*>{&u, &a, &h})
        require_same_shape(g, *t, "gated_activation"), require_same_dtype(g, *t, "gated_activation");
    const Launch l = elementwise_launch(g.numel(), sm_count());
    if (!l.grid) return;
    dispatch(g.dtype(), [&](auto tag) {
        using D = decltype(tag);
        gated_kernel<D>
            <<<l.grid, l.block, 0, stream()>>>(act, ptr<D>(g), ptr<D>(u), ptr<D>(a), ptr<D>(h), g.numel());
    });
    check_launch();
}

void CudaBackend::gated_activation_backward(Activation act, const Tensor& g, const Tensor& a, const Tensor& u,
                                            const Tensor& dh, Tensor& du, Tensor& dg) {
    for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &u, &dh, &du, &dg})
        require_same_shape(g, *t, "gated_activation_backward"),
            require_same_dtype(g, *t, "gated_activation_backward");
    const Launch l = elementwise_launch(g.numel(), sm_count());
    if (!l.grid) return;
    dispatch(g.dtype(), [&](auto tag) {
        using D = decltype(tag);
        gated_backward_kernel<D><<<l.grid, l.block, 0, stream()>>>(
            act, ptr<D>(g), ptr<D>(a), ptr<D>(u), ptr<D>(dh), ptr<D>(du), ptr<D>(dg), g.numel());
    });
    check_launch();
}

void CudaBackend::fill(Tensor& t, double value) {
    const Launch l = elementwise_launch(t.numel(), sm_count());
    if (!l.grid) return;
    dispatch(t.dtype(), [&](auto tag) {
        using D = decltype(tag);
        fill_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(t), static_cast<dacc_t<D>>(value), t.numel());
    });
    check_launch();
}

void CudaBackend::copy(const Tensor& src, Tensor& dst) {
    require_same_shape(src, dst, "copy");
    if (src.dtype() == dst.dtype()) {
        copy_bytes(dst.raw(), Device::cuda, src.raw(), src.device(), src.nbytes());
        return;
    }
    const Launch l = elementwise_launch(src.numel(), sm_count());
    if (!l.grid) return;
    dispatch(src.dtype(), [&](auto s) {
        dispatch(dst.dtype(), [&](auto d) {
            using S = decltype(s);
            using D = decltype(d);
            convert_kernel<S, D><<<l.grid, l.block, 0, stream()>>>(ptr<S>(src), ptr<D>(dst), src.numel());
        });
    });
    check_launch();
}

void CudaBackend::add_bias(Tensor& y, const Tensor& bias) {
    const int64_t n = bias.numel(), rows = n == 0 ? 0 : y.numel() / n;
    PTOOL_REQUIRE(y.size(-1) == n, "add_bias: y {} bias {}", shape_str(y.shape()), shape_str(bias.shape()));
    const Launch l = elementwise_launch(rows * n, sm_count());
    if (!l.grid) return;
    dispatch(y.dtype(), [&](auto tag) {
        using D = decltype(tag);
        add_bias_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(y), ptr<D>(bias), rows, n);
    });
    check_launch();
}

void CudaBackend::sum_rows(const Tensor& dy, Tensor& db, bool acc) {
    const int64_t n = db.numel(), rows = n == 0 ? 0 : dy.numel() / n;
    PTOOL_REQUIRE(dy.size(-1) == n, "sum_rows: dy {} db {}", shape_str(dy.shape()), shape_str(db.shape()));
    const Launch l = elementwise_launch(n, sm_count());
    if (!l.grid) return;
    dispatch(dy.dtype(), [&](auto tag) {
        using D = decltype(tag);
        sum_rows_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(dy), ptr<D>(db), rows, n, acc);
    });
    check_launch();
}

double CudaBackend::sum_all(const Tensor& x) {
    Tensor out({}, DType::float64, Device::cuda);
    if (x.numel() == 0) return 0.0;
    dispatch(x.dtype(), [&](auto tag) {
        using D = decltype(tag);
        sum_all_kernel<D><<<1, 1024, 0, stream()>>>(ptr<D>(x), x.numel(), ptr<double>(out));
    });
    check_launch();
    return out.item();
}

void CudaBackend::sgd_step(Tensor& p, const Tensor& g, Tensor& buf, double lr, double momentum,
                           double weight_decay, bool first_step) {
    require_same_shape(p, g, "sgd_step");
    const Launch l = elementwise_launch(p.numel(), sm_count());
    if (!l.grid) return;
    dispatch(p.dtype(), [&](auto tag) {
        using D = decltype(tag);
        sgd_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(p), ptr<D>(g),
                                                        momentum != 0.0 ? ptr<D>(buf) : nullptr, p.numel(),
                                                        lr, momentum, weight_decay, first_step);
    });
    check_launch();
}

void CudaBackend::adamw_step(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, int64_t step, double lr,
                             double beta1, double beta2, double eps, double weight_decay) {
    require_same_shape(p, g, "adamw_step");
    const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step)));
    const Launch l = elementwise_launch(p.numel(), sm_count());
    if (!l.grid) return;
    dispatch(p.dtype(), [&](auto tag) {
        using D = decltype(tag);
        adamw_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(p), ptr<D>(g), ptr<D>(m), ptr<D>(v),
                                                          p.numel(), lr, beta1, beta2, eps, weight_decay,
                                                          lr / bc1, bc2_sqrt);
    });
    check_launch();
}

}  // namespace ptool
