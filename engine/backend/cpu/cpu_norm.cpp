// Normalisation kernels on the CPU: layer_norm / rms_norm over the last dim, batch_norm per
// channel of [N, C]. Statistics are accumulated in double and kept in float32 (float64 for
// float64 inputs), as PyTorch keeps them in the accumulate type.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace ptool {

void CpuBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps, bool rms,
                            Tensor& y, Tensor& mean, Tensor& rstd) {
    const int64_t d = x.size(-1), rows = d == 0 ? 0 : x.numel() / d;
    PTOOL_REQUIRE(mean.numel() == rows && rstd.numel() == rows, "layer_norm: stats must have {} rows", rows);
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* px = x.data<T>();
        T* py = y.data<T>();
        const T* pw = w.defined() ? w.data<T>() : nullptr;
        const T* pb = b.defined() ? b.data<T>() : nullptr;
        for (int64_t r = 0; r < rows; ++r) {
            const T* xr = px + r * d;
            double mu = 0.0, var = 0.0;
            if (!rms) {
                for (int64_t j = 0; j < d; ++j) mu += static_cast<double>(A(xr[j]));
                mu /= static_cast<double>(d);
            }
            for (int64_t j = 0; j < d; ++j) {
                double c = static_cast<double>(A(xr[j])) - mu;
                var += c * c;
            }
            var /= static_cast<double>(d);
            const A a_mu = A(mu), a_rstd = A(1.0 / std::sqrt(var + eps));
            mean.set(r, static_cast<double>(a_mu));
            rstd.set(r, static_cast<double>(a_rstd));
            for (int64_t j = 0; j < d; ++j) {
                A v = (A(xr[j]) - a_mu) * a_rstd;
                if (pw) v = v * A(pw[j]);
                if (pb) v = v + A(pb[j]);
                py[r * d + j] = T(v);
            }
        }
    });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w (rms: no mean(g) term).
void CpuBackend::layer_norm_backward(const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dy, bool rms, Tensor& dx, Tensor* dw, Tensor* db) {
    const int64_t d = x.size(-1), rows = d == 0 ? 0 : x.numel() / d;
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *px = x.data<T>(), *pdy = dy.data<T>();
        const T* pw = w.defined() ? w.data<T>() : nullptr;
        T* pdx = dx.data<T>();
        std::vector<double> dw_acc(d, 0.0), db_acc(d, 0.0);
        for (int64_t r = 0; r < rows; ++r) {
            const A mu = A(mean.item(r)), rs = A(rstd.item(r));
            double sum_g = 0.0, sum_gx = 0.0;
            for (int64_t j = 0; j < d; ++j) {
                const A xhat = (A(px[r * d + j]) - mu) * rs;
                const A g = A(pdy[r * d + j]) * (pw ? A(pw[j]) : A(1));
                sum_g += static_cast<double>(g);
                sum_gx += static_cast<double>(g * xhat);
                dw_acc[j] += static_cast<double>(A(pdy[r * d + j]) * xhat);
                db_acc[j] += static_cast<double>(A(pdy[r * d + j]));
            }
            const A mean_g = rms ? A(0) : A(sum_g / static_cast<double>(d));
            const A mean_gx = A(sum_gx / static_cast<double>(d));
            for (int64_t j = 0; j < d; ++j) {
                const A xhat = (A(px[r * d + j]) - mu) * rs;
                const A g = A(pdy[r * d + j]) * (pw ? A(pw[j]) : A(1));
                pdx[r * d + j] = T(rs * (g - mean_g - xhat * mean_gx));
            }
        }
        for (int64_t j = 0; j < d; ++j) {
            if (dw) dw->set(j, dw->item(j) + static_cast<double>(A(dw_acc[j])));
            if (db) db->set(j, db->item(j) + static_cast<double>(A(db_acc[j])));
        }
    });
}

void CpuBackend::channel_moments(const Tensor& x, Tensor& mean, Tensor& var) {
    PTOOL_REQUIRE(x.dim() == 2, "batch_norm expects [N, C], got {}", shape_str(x.shape()));
    const int64_t n = x.size(0), c = x.size(1);
    for (int64_t j = 0; j < c; ++j) {
        double mu = 0.0, v = 0.0;
        for (int64_t i = 0; i < n; ++i) mu += x.item(i * c + j);
        mu /= static_cast<double>(n);
        for (int64_t i = 0; i < n; ++i) v += (x.item(i * c + j) - mu) * (x.item(i * c + j) - mu);
        mean.set(j, mu);
        var.set(j, v / static_cast<double>(n));
    }
}

void CpuBackend::batch_norm_apply(const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& w,
                                  const Tensor& b, Tensor& y) {
    const int64_t n = x.size(0), c = x.size(1);
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T* px = x.data<T>();
        T* py = y.data<T>();
        for (int64_t j = 0; j < c; ++j) {
            const A mu = A(mean.item(j)), rs = A(rstd.item(j));
            const A wj = w.defined() ? A(w.item(j)) : A(1), bj = b.defined() ? A(b.item(j)) : A(0);
            for (int64_t i = 0; i < n; ++i) py[i * c + j] = T((A(px[i * c + j]) - mu) * rs * wj + bj);
        }
    });
}

void CpuBackend::batch_norm_grad_sums(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& dy, Tensor& sum_dy, Tensor& sum_dy_xhat) {
    const int64_t n = x.size(0), c = x.size(1);
    for (int64_t j = 0; j < c; ++j) {
        const double mu = mean.item(j), rs = rstd.item(j);
        double s = 0.0, sx = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            const double g = dy.item(i * c + j);
            s += g;
            sx += g * (x.item(i * c + j) - mu) * rs;
        }
        sum_dy.set(j, s);
        sum_dy_xhat.set(j, sx);
    }
}

void CpuBackend::batch_norm_backward_input(const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                           const Tensor& w, const Tensor& dy, const Tensor& sum_dy,
                                           const Tensor& sum_dy_xhat, double count, Tensor& dx) {
    const int64_t n = x.size(0), c = x.size(1);
    dispatch_float(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        const T *px = x.data<T>(), *pdy = dy.data<T>();
        T* pdx = dx.data<T>();
        for (int64_t j = 0; j < c; ++j) {
            const A mu = A(mean.item(j)), rs = A(rstd.item(j)), wj = w.defined() ? A(w.item(j)) : A(1);
            const A mdy = A(sum_dy.item(j) / count), mdyx = A(sum_dy_xhat.item(j) / count);
            for (int64_t i = 0; i < n; ++i) {
                const A xhat = (A(px[i * c + j]) - mu) * rs;
                pdx[i * c + j] = T(wj * rs * (A(pdy[i * c + j]) - mdy - xhat * mdyx));
            }
        }
    });
}

}  // namespace ptool
