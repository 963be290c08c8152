// Embedding, attention helpers (head transpose, row softmax) and losses on the CPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_threads.h"

namespace ptool {
namespace {
// rows of `width` elements a chunk: about kElementGrain elements
int64_t row_grain(int64_t width) {
    return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(width, 1));
}
}  // namespace

void CpuBackend::embedding(const Tensor& ids, const Tensor& w, Tensor& y) {
    const int64_t vocab = w.size(0), d = w.size(1), n = ids.numel();
    size_t row = static_cast<size_t>(d) * dtype_size(w.dtype());
    for (int64_t i = 0; i < n; ++i) {
        const int64_t id = id_at(ids, i);
        if (id < 0) {
            std::memset(static_cast<char*>(y.raw()) + i * row, 0, row);
            continue;
        }
        if (id >= vocab)
            throw InputError(fmt::format(
                "token id {} at position {} is out of range for an embedding of {} rows", id, i, vocab));
        std::memcpy(static_cast<char*>(y.raw()) + i * row, static_cast<const char*>(w.raw()) + id * row, row);
    }
}

void CpuBackend::embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dw) {
    const int64_t d = dw.size(1), n = ids.numel();
    dispatch_float(dw.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* pdy = dy.data<T>();
        T* pdw = dw.data<T>();
        for (int64_t i = 0; i < n; ++i) {
            const int64_t id = id_at(ids, i);
            if (id < 0) continue;
            for (int64_t j = 0; j < d; ++j) pdw[id * d + j] = T(A(pdw[id * d + j]) + A(pdy[i * d + j]));
        }
    });
}

void CpuBackend::transpose12(const Tensor& x, Tensor& y) {
    PTOOL_REQUIRE(x.dim() == 4, "transpose12 expects 4-D, got {}", shape_str(x.shape()));
    const int64_t a = x.size(0), b = x.size(1), c = x.size(2), d = x.size(3);
    PTOOL_REQUIRE(y.shape() == (Shape{a, c, b, d}), "transpose12: y {} for x {}", shape_str(y.shape()),
                  shape_str(x.shape()));
    const size_t row = static_cast<size_t>(d) * dtype_size(x.dtype());
    const char* px = static_cast<const char*>(x.raw());
    char* py = static_cast<char*>(y.raw());
    for (int64_t i = 0; i < a; ++i)
        for (int64_t j = 0; j < b; ++j)
            for (int64_t k = 0; k < c; ++k)
                std::memcpy(py + ((i * c + k) * b + j) * row, px + ((i * b + j) * c + k) * row, row);
}

void CpuBackend::softmax(const Tensor& x, bool causal, Tensor& y) {
    const int64_t s = x.size(-1), t = x.dim() >= 2 ? x.size(-2) : 1, rows = s == 0 ? 0 : x.numel() / s;
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* px = x.data<T>();
        T* py = y.data<T>();
        cpu_for(rows, row_grain(s), [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
                // query position r % t sees keys [0, limit); the offset aligns the last query with the last
                // key
                const int64_t limit = causal ? std::min(s, (r % t) + 1 + (s - t)) : s;
                A mx = -std::numeric_limits<A>::infinity();
                for (int64_t j = 0; j < limit; ++j) mx = std::max(mx, A(px[r * s + j]));
                A sum = 0;
                for (int64_t j = 0; j < limit; ++j) sum += std::exp(A(px[r * s + j]) - mx);
                for (int64_t j = 0; j < s; ++j)
                    py[r * s + j] = T(j < limit ? std::exp(A(px[r * s + j]) - mx) / sum : A(0));
            }
        });
    });
}

// dx = y * (dy - sum(dy * y)) per row
void CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
    const int64_t s = y.size(-1), rows = s == 0 ? 0 : y.numel() / s;
    dispatch_float(y.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *py = y.data<T>(), *pdy = dy.data<T>();
        T* pdx = dx.data<T>();
        cpu_for(rows, row_grain(s), [&](int64_t begin, int64_t end) {
            for (int64_t r = begin; r < end; ++r) {
                A dot = 0;
                for (int64_t j = 0; j < s; ++j) dot += A(py[r * s + j]) * A(pdy[r * s + j]);
                for (int64_t j = 0; j < s; ++j)
                    pdx[r * s + j] = T(A(py[r * s + j]) * (A(pdy[r * s + j]) - dot));
            }
        });
    });
}

// Flash attention's blocked softmax (backend.h). Stats are in the accumulate type A.
void CpuBackend::softmax_stats(const Tensor& x, Tensor& y, Tensor& m, Tensor& l) {
    const int64_t s = x.size(-1), rows = s == 0 ? 0 : x.numel() / s;
    PTOOL_REQUIRE(m.numel() == rows && l.numel() == rows, "softmax_stats: stats must have {} rows", rows);
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* px = x.data<T>();
        T* py = y.data<T>();
        A *pm = m.data<A>(), *pl = l.data<A>();
        for (int64_t r = 0; r < rows; ++r) {
            A mx = -std::numeric_limits<A>::infinity();
            for (int64_t j = 0; j < s; ++j) mx = std::max(mx, A(px[r * s + j]));
            A sum = 0;
            if (mx != -std::numeric_limits<A>::infinity())
                for (int64_t j = 0; j < s; ++j) sum += std::exp(A(px[r * s + j]) - mx);
            for (int64_t j = 0; j < s; ++j)
                py[r * s + j] = T(sum > 0 ? std::exp(A(px[r * s + j]) - mx) / sum : A(0));
            pm[r] = mx, pl[r] = sum;
        }
    });
}

void CpuBackend::softmax_merge(Tensor& o, Tensor& m, Tensor& l, const Tensor& o_b, const Tensor& m_b,
                               const Tensor& l_b) {
    const int64_t d = o.size(-1), rows = d == 0 ? 0 : o.numel() / d;
    PTOOL_REQUIRE(m.numel() == rows && l.numel() == rows && m_b.numel() == rows && l_b.numel() == rows &&
                      o_b.numel() == o.numel(),
                  "softmax_merge: {} rows of {}", rows, d);
    dispatch_float(o.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        T* po = o.data<T>();
        const T* pb = o_b.data<T>();
        A *pm = m.data<A>(), *pl = l.data<A>();
        const A *pmb = m_b.data<A>(), *plb = l_b.data<A>();
        for (int64_t r = 0; r < rows; ++r) {
            const A mx = std::max(pm[r], pmb[r]);
            const A a = pl[r] > 0 ? pl[r] * std::exp(pm[r] - mx) : A(0),
                    b = plb[r] > 0 ? plb[r] * std::exp(pmb[r] - mx) : A(0), sum = a + b;
            for (int64_t j = 0; j < d; ++j)
                po[r * d + j] = T(sum > 0 ? (a * A(po[r * d + j]) + b * A(pb[r * d + j])) / sum : A(0));
            pm[r] = mx, pl[r] = sum;
        }
    });
}

void CpuBackend::softmax_from_stats(const Tensor& x, const Tensor& m, const Tensor& l, Tensor& y) {
    const int64_t s = x.size(-1), rows = s == 0 ? 0 : x.numel() / s;
    PTOOL_REQUIRE(m.numel() == rows && l.numel() == rows, "softmax_from_stats: stats must have {} rows",
                  rows);
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* px = x.data<T>();
        T* py = y.data<T>();
        const A *pm = m.data<A>(), *pl = l.data<A>();
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < s; ++j)
                py[r * s + j] = T(pl[r] > 0 ? std::exp(A(px[r * s + j]) - pm[r]) / pl[r] : A(0));
    });
}

void CpuBackend::softmax_backward_rows(const Tensor& y, const Tensor& dy, const Tensor& o, const Tensor& d_o,
                                       Tensor& dx) {
    const int64_t s = y.size(-1), rows = s == 0 ? 0 : y.numel() / s, d = o.size(-1);
    PTOOL_REQUIRE(o.numel() == rows * d && d_o.numel() == rows * d, "softmax_backward_rows: {} rows", rows);
    dispatch_float(y.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *py = y.data<T>(), *pdy = dy.data<T>(), *po = o.data<T>(), *pdo = d_o.data<T>();
        T* pdx = dx.data<T>();
        for (int64_t r = 0; r < rows; ++r) {
            A dot = 0;
            for (int64_t j = 0; j < d; ++j) dot += A(po[r * d + j]) * A(pdo[r * d + j]);
            for (int64_t j = 0; j < s; ++j) pdx[r * s + j] = T(A(py[r * s + j]) * (A(pdy[r * s + j]) - dot));
        }
    });
}

// torch.nn.functional.cross_entropy's sum over the rows whose target is not ignore_index, divided by
// `divisor` (reduction='mean': their count; with none, 0 / 0 = NaN, the gradients 0). logits: [N, V],
// target: [N].
double CpuBackend::cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                 double divisor, Tensor& dlogits) {
    const int64_t v = logits.size(-1), n = v == 0 ? 0 : logits.numel() / v;
    PTOOL_REQUIRE(target.numel() == n, "cross_entropy: {} targets for {} rows", target.numel(), n);
    return dispatch_float(logits.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* pl = logits.data<T>();
        T* pd = dlogits.data<T>();
        for (int64_t i = 0; i < n; ++i) {
            const int64_t t = id_at(target, i);
            if (t != ignore_index && (t < 0 || t >= v))
                throw InputError(
                    fmt::format("class id {} at position {} is out of range for {} classes", t, i, v));
        }
        std::vector<double> row_loss(static_cast<size_t>(n), 0.0);  // added in row order below
        cpu_for(n, row_grain(v), [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const int64_t t = id_at(target, i);
                A mx = -std::numeric_limits<A>::infinity();
                for (int64_t j = 0; j < v; ++j) mx = std::max(mx, A(pl[i * v + j]));
                A sum = 0;
                for (int64_t j = 0; j < v; ++j) sum += std::exp(A(pl[i * v + j]) - mx);
                const A lse = mx + std::log(sum);
                if (t != ignore_index)
                    row_loss[static_cast<size_t>(i)] = static_cast<double>(lse - A(pl[i * v + t]));
                // an ignored row's gradient is 0, also where no row counts (divisor 0): PyTorch's
                // nll_loss backward skips it, so a call with no valid target has a NaN loss (0 / 0)
                // and zero gradients, not NaN ones
                for (int64_t j = 0; j < v; ++j)
                    pd[i * v + j] =
                        t == ignore_index
                            ? T(0)
                            : T((std::exp(A(pl[i * v + j]) - lse) - A(j == t ? 1 : 0)) / A(divisor));
            }
        });
        double loss = 0.0;
        for (int64_t i = 0; i < n; ++i)
            if (id_at(target, i) != ignore_index) loss += row_loss[static_cast<size_t>(i)];
        return static_cast<double>(static_cast<A>(loss / divisor));
    });
}

// torch.nn.functional.mse_loss's sum of squares divided by `divisor` (reduction='mean': the elements).
double CpuBackend::mse(const Tensor& out, const Tensor& target, double divisor, Tensor& dout) {
    require_same_shape(out, target, "mse");
    return dispatch_float(out.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *po = out.data<T>(), *pt = target.data<T>();
        T* pd = dout.data<T>();
        double loss = 0.0;
        for (int64_t i = 0, m = out.numel(); i < m; ++i) {
            const A diff = A(po[i]) - A(pt[i]);
            loss += static_cast<double>(diff * diff);
            pd[i] = T(A(2) * diff / A(divisor));
        }
        return static_cast<double>(static_cast<A>(loss / divisor));
    });
}

}  // namespace ptool
