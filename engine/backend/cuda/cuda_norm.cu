// Normalisation kernels on the GPU. layer_norm / rms_norm: one block per row, statistics
// accumulated in double (as on the CPU) with a fixed-order block reduction. batch_norm: one
// thread per channel walking the rows in order in double, so its statistics agree bitwise with
// the CPU's; applying them is elementwise.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ptool {
namespace {
using namespace ptool::cuda;

template <class D, class S>
__global__ void layer_norm_kernel(const D* x, const D* w, const D* b, double eps, bool rms, D* y, S* mean,
                                  S* rstd, int64_t rows, int64_t d) {
    using A = dacc_t<D>;
    __shared__ double scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const D* xr = x + r * d;
        double mu = 0.0;
        if (!rms) {
            double s = 0.0;
            for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += static_cast<double>(to_acc(xr[j]));
            mu = block_sum(s, scratch) / static_cast<double>(d);
        }
        double v = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            const double c = static_cast<double>(to_acc(xr[j])) - mu;
            v += c * c;
        }
        const double var = block_sum(v, scratch) / static_cast<double>(d);
        const A a_mu = A(mu), a_rstd = A(1.0 / sqrt(var + eps));
        if (threadIdx.x == 0) mean[r] = S(a_mu), rstd[r] = S(a_rstd);
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            A val = (to_acc(xr[j]) - a_mu) * a_rstd;
            if (w) val = val * to_acc(w[j]);
            if (b) val = val + to_acc(b[j]);
            y[r * d + j] = from_acc<D>(val);
        }
    }
}

template <class D, class S>
__global__ void layer_norm_dx_kernel(const D* x, const D* w, const S* mean, const S* rstd, const D* dy,
                                     bool rms, D* dx, int64_t rows, int64_t d) {
    using A = dacc_t<D>;
    __shared__ double scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const A mu = A(mean[r]), rs = A(rstd[r]);
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            const A xhat = (to_acc(x[r * d + j]) - mu) * rs;
            const A g = to_acc(dy[r * d + j]) * (w ? to_acc(w[j]) : A(1));
            sg += static_cast<double>(g);
            sgx += static_cast<double>(g * xhat);
        }
        const double sum_g = block_sum(sg, scratch), sum_gx = block_sum(sgx, scratch);
        const A mean_g = rms ? A(0) : A(sum_g / static_cast<double>(d));
        const A mean_gx = A(sum_gx / static_cast<double>(d));
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            const A xhat = (to_acc(x[r * d + j]) - mu) * rs;
            const A g = to_acc(dy[r * d + j]) * (w ? to_acc(w[j]) : A(1));
            dx[r * d + j] = from_acc<D>(rs * (g - mean_g - xhat * mean_gx));
        }
    }
}

// dw[j] += sum_r dy * xhat, db[j] += sum_r dy: one thread per column, rows in order (the CPU's order).
template <class D, class S>
__global__ void layer_norm_dwdb_kernel(const D* x, const S* mean, const S* rstd, const D* dy, D* dw, D* db,
                                       int64_t rows, int64_t d) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(j, d) {
        double sw = 0.0, sb = 0.0;
        for (int64_t r = 0; r < rows; ++r) {
            const A xhat = (to_acc(x[r * d + j]) - A(mean[r])) * A(rstd[r]);
            sw += static_cast<double>(to_acc(dy[r * d + j]) * xhat);
            sb += static_cast<double>(to_acc(dy[r * d + j]));
        }
        if (dw) dw[j] = from_acc<D>(A(static_cast<double>(to_acc(dw[j])) + static_cast<double>(A(sw))));
        if (db) db[j] = from_acc<D>(A(static_cast<double>(to_acc(db[j])) + static_cast<double>(A(sb))));
    }
}

template <class D, class S>
__global__ void channel_moments_kernel(const D* x, S* mean, S* var, int64_t n, int64_t c) {
    PTOOL_GRID_STRIDE(j, c) {
        double mu = 0.0, v = 0.0;
        for (int64_t i = 0; i < n; ++i) mu += static_cast<double>(to_acc(x[i * c + j]));
        mu /= static_cast<double>(n);
        for (int64_t i = 0; i < n; ++i) {
            const double e = static_cast<double>(to_acc(x[i * c + j])) - mu;
            v += e * e;
        }
        mean[j] = S(mu);
        var[j] = S(v / static_cast<double>(n));
    }
}

template <class D, class S>
__global__ void batch_norm_apply_kernel(const D* x, const S* mean, const S* rstd, const D* w, const D* b,
                                        D* y, int64_t n, int64_t c) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, n * c) {
        const int64_t j = i % c;
        const A wj = w ? to_acc(w[j]) : A(1), bj = b ? to_acc(b[j]) : A(0);
        y[i] = from_acc<D>((to_acc(x[i]) - A(mean[j])) * A(rstd[j]) * wj + bj);
    }
}

template <class D, class S>
__global__ void batch_norm_grad_sums_kernel(const D* x, const S* mean, const S* rstd, const D* dy, S* sum_dy,
                                            S* sum_dy_xhat, int64_t n, int64_t c) {
    PTOOL_GRID_STRIDE(j, c) {
        const double mu = static_cast<double>(mean[j]), rs = static_cast<double>(rstd[j]);
        double s = 0.0, sx = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const double g = static_cast<double>(to_acc(dy[i * c + j]));
            s += g;
            sx += g * (static_cast<double>(to_acc(x[i * c + j])) - mu) * rs;
        }
        sum_dy[j] = S(s);
        sum_dy_xhat[j] = S(sx);
    }
}

template <class D, class S>
__global__ void batch_norm_dx_kernel(const D* x, const S* mean, const S* rstd, const D* w, const D* dy,
                                     const S* sum_dy, const S* sum_dy_xhat, double count, D* dx, int64_t n,
                                     int64_t c) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, n * c) {
        const int64_t j = i % c;
        const A mu = A(mean[j]), rs = A(rstd[j]), wj = w ? to_acc(w[j]) : A(1);
        const A mdy = A(static_cast<double>(sum_dy[j]) / count),
                mdyx = A(static_cast<double>(sum_dy_xhat[j]) / count);
        const A xhat = (to_acc(x[i]) - mu) * rs;
        dx[i] = from_acc<D>(wj * rs * (to_acc(dy[i]) - mdy - xhat * mdyx));
    }
}

// Calls f(D{}, S{}): D the data's device type, S the statistics' type (float, or double for float64).
template <class F>
void dispatch_with_stats(const Tensor& x, const Tensor& stats, F&& f) {
    PTOOL_REQUIRE(stats.dtype() == DType::float32 || stats.dtype() == DType::float64,
                  "norm statistics must be float32 or float64, got {}", dtype_name(stats.dtype()));
    dispatch(x.dtype(), [&](auto d) {
        if (stats.dtype() == DType::float64)
            f(d, double{});
        else
            f(d, float{});
    });
}

template <class D>
const D* opt(const Tensor& t) {
    return t.defined() ? ptr<D>(t) : nullptr;
}

}  // namespace

void CudaBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool rms,
                             Tensor& y, Tensor& mean, Tensor& rstd) {
    const RowDims r = row_dims(x);
    PTOOL_REQUIRE(mean.numel() == r.rows && rstd.numel() == r.rows, "layer_norm: stats must have {} rows",
                  r.rows);
    const Launch l = rows_launch(r.rows, r.cols);
    if (!l.grid) return;
    dispatch_with_stats(x, mean, [&](auto d, auto s) {
        using D = decltype(d);
        using S = decltype(s);
        layer_norm_kernel<D, S><<<l.grid, l.block, 0, stream()>>>(
            ptr<D>(x), opt<D>(w), opt<D>(b), eps, rms, ptr<D>(y), ptr<S>(mean), ptr<S>(rstd), r.rows, r.cols);
    });
    check_launch();
}

void CudaBackend::layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& dy, bool rms, Tensor& dx, Tensor* dw,
                                      Tensor* db) {
    const RowDims r = row_dims(x);
    const Launch l = rows_launch(r.rows, r.cols);
    if (!l.grid) return;
    dispatch_with_stats(x, mean, [&](auto d, auto s) {
        using D = decltype(d);
        using S = decltype(s);
        layer_norm_dx_kernel<D, S><<<l.grid, l.block, 0, stream()>>>(
            ptr<D>(x), opt<D>(w), ptr<S>(mean), ptr<S>(rstd), ptr<D>(dy), rms, ptr<D>(dx), r.rows, r.cols);
        const Launch c = elementwise_launch(r.cols, sm_count());
        if (c.grid && (dw || db))
            layer_norm_dwdb_kernel<D, S><<<c.grid, c.block, 0, stream()>>>(
                ptr<D>(x), ptr<S>(mean), ptr<S>(rstd), ptr<D>(dy), dw ? ptr<D>(*dw) : nullptr,
                db ? ptr<D>(*db) : nullptr, r.rows, r.cols);
    });
    check_launch();
}

void CudaBackend::channel_moments(const Tensor& x, Tensor& mean, Tensor& var) {
    PTOOL_REQUIRE(x.dim() == 2, "batch_norm expects [N, C], got {}", shape_str(x.shape()));
    const int64_t n = x.size(0), c = x.size(1);
    const Launch l = elementwise_launch(c, sm_count());
    if (!l.grid) return;
    dispatch_with_stats(x, mean, [&](auto d, auto s) {
        using D = decltype(d);
        using S = decltype(s);
        channel_moments_kernel<D, S>
            <<<l.grid, l.block, 0, stream()>>>(ptr<D>(x), ptr<S>(mean), ptr<S>(var), n, c);
    });
    check_launch();
}

void CudaBackend::batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                   const Tensor& b, Tensor& y) {
    const int64_t n = x.size(0), c = x.size(1);
    const Launch l = elementwise_launch(n * c, sm_count());
    if (!l.grid) return;
    dispatch_with_stats(x, mean, [&](auto d, auto s) {
        using D = decltype(d);
        using S = decltype(s);
        batch_norm_apply_kernel<D, S><<<l.grid, l.block, 0, stream()>>>(
            ptr<D>(x), ptr<S>(mean), ptr<S>(rstd), opt<D>(w), opt<D>(b), ptr<D>(y), n, c);
    });
    check_launch();
}

void CudaBackend::batch_norm_grad_sums(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                       const Tensor& dy, Tensor& sum_dy, Tensor& sum_dy_xhat) {
    const int64_t n = x.size(0), c = x.size(1);
    const Launch l = elementwise_launch(c, sm_count());
    if (!l.grid) return;
    dispatch_with_stats(x, mean, [&](auto d, auto s) {
        using D = decltype(d);
        using S = decltype(s);
        batch_norm_grad_sums_kernel<D, S><<<l.grid, l.block, 0, stream()>>>(
            ptr<D>(x), ptr<S>(mean), ptr<S>(rstd), ptr<D>(dy), ptr<S>(sum_dy), ptr<S>(sum_dy_xhat), n, c);
    });
    check_launch();
}

void CudaBackend::batch_norm_backward_input(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                            const Tensor& w, const Tensor& dy, const Tensor& sum_dy,
                                            const Tensor& sum_dy_xhat, double count, Tensor& dx) {
    const int64_t n = x.size(0), c = x.size(1);
    const Launch l = elementwise_launch(n * c, sm_count());
    if (!l.grid) return;
    dispatch_with_stats(x, mean, [&](auto d, auto s) {
        using D = decltype(d);
        using S = decltype(s);
        batch_norm_dx_kernel<D, S>
            <<<l.grid, l.block, 0, stream()>>>(ptr<D>(x), ptr<S>(mean), ptr<S>(rstd), opt<D>(w), ptr<D>(dy),
                                               ptr<S>(sum_dy), ptr<S>(sum_dy_xhat), count, ptr<D>(dx), n, c);
    });
    check_launch();
}

}  // namespace ptool
