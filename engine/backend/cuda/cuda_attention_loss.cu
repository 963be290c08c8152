// Embedding, attention helpers (head transpose, row softmax) and losses on the GPU.
// Ids and targets are validated on the host (they are small), so a bad id is the CPU backend's
// InputError, and the embedding gradient is accumulated without atomics: positions are grouped
// by id on the host and each (id, column) is summed over its positions in order, rounding after
// every add as the CPU does.
#include <algorithm>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ptool {
namespace {
using namespace ptool::cuda;

std::vector<int64_t> host_ids(const Tensor& ids) {
    const Tensor h = ids.to_device(Device::cpu);
    std::vector<int64_t> out(h.numel());
    for (int64_t i = 0; i < h.numel(); ++i) out[i] = id_at(h, i);
    return out;
}

// A loss as the CPU returns it: computed in double, rounded to the accumulate type.
double in_acc_type(double v, DType dt) {
    return dt == DType::float64 ? v : static_cast<double>(static_cast<float>(v));
}

Tensor device_ids(const std::vector<int64_t>& v) {
    Tensor h({static_cast<int64_t>(v.size())}, DType::int64);
    std::copy(v.begin(), v.end(), h.data<int64_t>());
    return h.to_device(Device::cuda);
}

template <class D>
__global__ void embedding_kernel(const int64_t* ids, const D* w, D* y, int64_t n, int64_t d) {
    PTOOL_GRID_STRIDE(i, n * d) {
        const int64_t id = ids[i / d];
        y[i] = id < 0 ? from_acc<D>(0) : w[id * d + i % d];
    }
}

// groups: rows of dw to update; [starts[g], starts[g + 1]) index `positions` (in order).
template <class D>
__global__ void embedding_backward_kernel(const int64_t* group_ids, const int64_t* starts,
                                          const int64_t* positions, const D* dy, D* dw, int64_t groups,
                                          int64_t d) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, groups * d) {
        const int64_t g = i / d, j = i % d, row = group_ids[g];
        A acc = to_acc(dw[row * d + j]);
        for (int64_t p = starts[g]; p < starts[g + 1]; ++p)
            acc = to_acc(from_acc<D>(acc + to_acc(dy[positions[p] * d + j])));
        dw[row * d + j] = from_acc<D>(acc);
    }
}

template <class D>
__global__ void transpose12_kernel(const D* x, D* y, int64_t a, int64_t b, int64_t c, int64_t d) {
    PTOOL_GRID_STRIDE(o, a * b * c * d) {  // o indexes y: [a, c, b, d]
        const int64_t dd = o % d, j = (o / d) % b, k = (o / (d * b)) % c, i = o / (d * b * c);
        y[o] = x[((i * b + j) * c + k) * d + dd];
    }
}

template <class D>
__global__ void softmax_kernel(const D* x, bool causal, D* y, int64_t rows, int64_t s, int64_t t) {
    using A = dacc_t<D>;
    __shared__ A scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t limit = causal ? min(s, (r % t) + 1 + (s - t)) : s;
        A mx = -std::numeric_limits<A>::infinity();
        for (int64_t j = threadIdx.x; j < limit; j += blockDim.x) mx = max(mx, to_acc(x[r * s + j]));
        mx = block_max(mx, scratch);
        A sum = 0;
        for (int64_t j = threadIdx.x; j < limit; j += blockDim.x) sum += exp(to_acc(x[r * s + j]) - mx);
        sum = block_sum(sum, scratch);
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
            y[r * s + j] = from_acc<D>(j < limit ? exp(to_acc(x[r * s + j]) - mx) / sum : A(0));
    }
}

template <class D>
__global__ void softmax_backward_kernel(const D* y, const D* dy, D* dx, int64_t rows, int64_t s) {
    using A = dacc_t<D>;
    __shared__ A scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        A dot = 0;
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
            dot += to_acc(y[r * s + j]) * to_acc(dy[r * s + j]);
        dot = block_sum(dot, scratch);
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
            dx[r * s + j] = from_acc<D>(to_acc(y[r * s + j]) * (to_acc(dy[r * s + j]) - dot));
    }
}

// Flash attention's blocked softmax (backend.h): one block per row; stats in the accumulate type.
template <class D>
__global__ void softmax_stats_kernel(const D* x, D* y, dacc_t<D>* m, dacc_t<D>* l, int64_t rows, int64_t s) {
    using A = dacc_t<D>;
    __shared__ A scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        A mx = -std::numeric_limits<A>::infinity();
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x) mx = max(mx, to_acc(x[r * s + j]));
        mx = block_max(mx, scratch);
        A sum = 0;
        if (mx != -std::numeric_limits<A>::infinity())
            for (int64_t j = threadIdx.x; j < s; j += blockDim.x) sum += exp(to_acc(x[r * s + j]) - mx);
        sum = block_sum(sum, scratch);
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
            y[r * s + j] = from_acc<D>(sum > 0 ? exp(to_acc(x[r * s + j]) - mx) / sum : A(0));
        if (threadIdx.x == 0) m[r] = mx, l[r] = sum;
    }
}

template <class D>
__global__ void softmax_merge_kernel(D* o, dacc_t<D>* m, dacc_t<D>* l, const D* o_b, const dacc_t<D>* m_b,
                                     const dacc_t<D>* l_b, int64_t rows, int64_t d) {
    using A = dacc_t<D>;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const A mx = max(m[r], m_b[r]);
        const A a = l[r] > 0 ? l[r] * exp(m[r] - mx) : A(0),
                b = l_b[r] > 0 ? l_b[r] * exp(m_b[r] - mx) : A(0), sum = a + b;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            o[r * d + j] =
                from_acc<D>(sum > 0 ? (a * to_acc(o[r * d + j]) + b * to_acc(o_b[r * d + j])) / sum : A(0));
        __syncthreads();  // every thread has read m[r] and l[r]
        if (threadIdx.x == 0) m[r] = mx, l[r] = sum;
    }
}

template <class D>
__global__ void softmax_from_stats_kernel(const D* x, const dacc_t<D>* m, const dacc_t<D>* l, D* y, int64_t n,
                                          int64_t s) {
    using A = dacc_t<D>;
    PTOOL_GRID_STRIDE(i, n) {
        const int64_t r = i / s;
        y[i] = from_acc<D>(l[r] > 0 ? exp(to_acc(x[i]) - m[r]) / l[r] : A(0));
    }
}

template <class D>
__global__ void softmax_backward_rows_kernel(const D* y, const D* dy, const D* o, const D* d_o, D* dx,
                                             int64_t rows, int64_t s, int64_t d) {
    using A = dacc_t<D>;
    __shared__ A scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        A dot = 0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            dot += to_acc(o[r * d + j]) * to_acc(d_o[r * d + j]);
        dot = block_sum(dot, scratch);
        for (int64_t j = threadIdx.x; j < s; j += blockDim.x)
            dx[r * s + j] = from_acc<D>(to_acc(y[r * s + j]) * (to_acc(dy[r * s + j]) - dot));
    }
}

// Per row: loss_r = lse - x[t] (0 for ignored rows), dlogits = (softmax - onehot) / divisor (0 for
// ignored rows, also where the divisor is 0: PyTorch's nll_loss backward skips them).
template <class D>
__global__ void cross_entropy_kernel(const D* logits, const int64_t* target, D* dlogits, double* row_loss,
                                     int64_t rows, int64_t v, int64_t ignore_index, double divisor) {
    using A = dacc_t<D>;
    __shared__ A scratch[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t t = target[r];
        const D* x = logits + r * v;
        A mx = -std::numeric_limits<A>::infinity();
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x) mx = max(mx, to_acc(x[j]));
        mx = block_max(mx, scratch);
        A sum = 0;
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += exp(to_acc(x[j]) - mx);
        sum = block_sum(sum, scratch);
        const A lse = mx + log(sum);
        if (threadIdx.x == 0) row_loss[r] = t == ignore_index ? 0.0 : static_cast<double>(lse - to_acc(x[t]));
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
            dlogits[r * v + j] =
                t == ignore_index ? from_acc<D>(A(0))
                                  : from_acc<D>((exp(to_acc(x[j]) - lse) - A(j == t ? 1 : 0)) / A(divisor));
    }
}

template <class D>
__global__ void mse_kernel(const D* out, const D* target, D* dout, int64_t n, double divisor,
                           double* loss) {  // one block
    using A = dacc_t<D>;
    __shared__ double scratch[32];
    double s = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const A diff = to_acc(out[i]) - to_acc(target[i]);
        s += static_cast<double>(diff * diff);
        dout[i] = from_acc<D>(A(2) * diff / A(divisor));
    }
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) *loss = s;
}

}  // namespace

void CudaBackend::embedding(const Tensor& ids, const Tensor& w, Tensor& y) {
    const int64_t vocab = w.size(0), d = w.size(1), n = ids.numel();
    std::vector<int64_t> h = host_ids(ids);
    for (int64_t i = 0; i < n; ++i)
        if (h[i] >= vocab)
            throw InputError(fmt::format(
                "token id {} at position {} is out of range for an embedding of {} rows", h[i], i, vocab));
    const Launch l = elementwise_launch(n * d, sm_count());
    if (!l.grid) return;
    const Tensor ids64 = device_ids(h);
    dispatch(w.dtype(), [&](auto tag) {
        using D = decltype(tag);
        embedding_kernel<D>
            <<<l.grid, l.block, 0, stream()>>>(ptr<int64_t>(ids64), ptr<D>(w), ptr<D>(y), n, d);
    });
    check_launch();
    cuda_synchronize_current_stream();  // ids64 is freed on return
}

void CudaBackend::embedding_backward(const Tensor& ids, const Tensor& dy, Tensor& dw) {
    const int64_t d = dw.size(1);
    const std::vector<int64_t> h = host_ids(ids);
    std::vector<int64_t> order;  // positions with a local id, grouped by id, in position order
    for (int64_t i = 0; i < static_cast<int64_t>(h.size()); ++i)
        if (h[i] >= 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return h[a] < h[b]; });
    std::vector<int64_t> group_ids, starts;
    for (size_t p = 0; p < order.size(); ++p)
        if (p == 0 || h[order[p]] != h[order[p - 1]]) group_ids.push_back(h[order[p]]), starts.push_back(p);
    starts.push_back(static_cast<int64_t>(order.size()));
    const int64_t groups = static_cast<int64_t>(group_ids.size());
    const Launch l = elementwise_launch(groups * d, sm_count());
    if (!l.grid) return;
    const Tensor g = device_ids(group_ids), s = device_ids(starts), pos = device_ids(order);
    dispatch(dw.dtype(), [&](auto tag) {
        using D = decltype(tag);
        embedding_backward_kernel<D><<<l.grid, l.block, 0, stream()>>>(
            ptr<int64_t>(g), ptr<int64_t>(s), ptr<int64_t>(pos), ptr<D>(dy), ptr<D>(dw), groups, d);
    });
    check_launch();
    cuda_synchronize_current_stream();
}

void CudaBackend::transpose12(const Tensor& x, Tensor& y) {
    PTOOL_REQUIRE(x.dim() == 4, "transpose12 expects 4-D, got {}", shape_str(x.shape()));
    const int64_t a = x.size(0), b = x.size(1), c = x.size(2), d = x.size(3);
    PTOOL_REQUIRE(y.shape() == (Shape{a, c, b, d}), "transpose12: y {} for x {}", shape_str(y.shape()),
                  shape_str(x.shape()));
    const Launch l = elementwise_launch(x.numel(), sm_count());
    if (!l.grid) return;
    dispatch(x.dtype(), [&](auto tag) {
        using D = decltype(tag);
        transpose12_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(x), ptr<D>(y), a, b, c, d);
    });
    check_launch();
}

void CudaBackend::softmax(const Tensor& x, bool causal, Tensor& y) {
    const RowDims r = row_dims(x);
    const int64_t t = x.dim() >= 2 ? x.size(-2) : 1;
    const Launch l = rows_launch(r.rows, r.cols);
    if (!l.grid) return;
    dispatch(x.dtype(), [&](auto tag) {
        using D = decltype(tag);
        softmax_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(x), causal, ptr<D>(y), r.rows, r.cols, t);
    });
    check_launch();
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
    const RowDims r = row_dims(y);
    const Launch l = rows_launch(r.rows, r.cols);
    if (!l.grid) return;
    dispatch(y.dtype(), [&](auto tag) {
        using D = decltype(tag);
        softmax_backward_kernel<D>
            <<<l.grid, l.block, 0, stream()>>>(ptr<D>(y), ptr<D>(dy), ptr<D>(dx), r.rows, r.cols);
    });
    check_launch();
}

void CudaBackend::softmax_stats(const Tensor& x, Tensor& y, Tensor& m, Tensor& l) {
    const RowDims r = row_dims(x);
    PTOOL_REQUIRE(m.numel() == r.rows && l.numel() == r.rows, "softmax_stats: stats must have {} rows",
                  r.rows);
    const Launch lc = rows_launch(r.rows, r.cols);
    if (!lc.grid) return;
    dispatch(x.dtype(), [&](auto tag) {
        using D = decltype(tag);
        using A = dacc_t<D>;
        softmax_stats_kernel<D>
            <<<lc.grid, lc.block, 0, stream()>>>(ptr<D>(x), ptr<D>(y), ptr<A>(m), ptr<A>(l), r.rows, r.cols);
    });
    check_launch();
}

void CudaBackend::softmax_merge(Tensor& o, Tensor& m, Tensor& l, const Tensor& o_b, const Tensor& m_b,
                                const Tensor& l_b) {
    const RowDims r = row_dims(o);
    PTOOL_REQUIRE(m.numel() == r.rows && l.numel() == r.rows && m_b.numel() == r.rows &&
                      l_b.numel() == r.rows && o_b.numel() == o.numel(),
                  "softmax_merge: {} rows of {}", r.rows, r.cols);
    const Launch lc = rows_launch(r.rows, r.cols);
    if (!lc.grid) return;
    dispatch(o.dtype(), [&](auto tag) {
        using D = decltype(tag);
        using A = dacc_t<D>;
        softmax_merge_kernel<D><<<lc.grid, lc.block, 0, stream()>>>(
            ptr<D>(o), ptr<A>(m), ptr<A>(l), ptr<D>(o_b), ptr<A>(m_b), ptr<A>(l_b), r.rows, r.cols);
    });
    check_launch();
}

void CudaBackend::softmax_from_stats(const Tensor& x, const Tensor& m, const Tensor& l, Tensor& y) {
    const RowDims r = row_dims(x);
    PTOOL_REQUIRE(m.numel() == r.rows && l.numel() == r.rows, "softmax_from_stats: stats must have {} rows",
                  r.rows);
    const Launch lc = elementwise_launch(x.numel(), sm_count());
    if (!lc.grid) return;
    dispatch(x.dtype(), [&](auto tag) {
        using D = decltype(tag);
        using A = dacc_t<D>;
        softmax_from_stats_kernel<D><<<lc.grid, lc.block, 0, stream()>>>(ptr<D>(x), ptr<A>(m), ptr<A>(l),
                                                                         ptr<D>(y), x.numel(), r.cols);
    });
    check_launch();
}

void CudaBackend::softmax_backward_rows(const Tensor& y, const Tensor& dy, const Tensor& o, const Tensor& d_o,
                                        Tensor& dx) {
    const RowDims r = row_dims(y), ro = row_dims(o);
    PTOOL_REQUIRE(ro.rows == r.rows && d_o.numel() == o.numel(), "softmax_backward_rows: {} rows", r.rows);
    const Launch lc = rows_launch(r.rows, std::max(r.cols, ro.cols));
    if (!lc.grid) return;
    dispatch(y.dtype(), [&](auto tag) {
        using D = decltype(tag);
        softmax_backward_rows_kernel<D><<<lc.grid, lc.block, 0, stream()>>>(
            ptr<D>(y), ptr<D>(dy), ptr<D>(o), ptr<D>(d_o), ptr<D>(dx), r.rows, r.cols, ro.cols);
    });
    check_launch();
}

double CudaBackend::cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                  double divisor, Tensor& dlogits) {
    const RowDims r = row_dims(logits);
    PTOOL_REQUIRE(target.numel() == r.rows, "cross_entropy: {} targets for {} rows", target.numel(), r.rows);
    const std::vector<int64_t> h = host_ids(target);
    for (int64_t i = 0; i < r.rows; ++i)
        if (h[i] != ignore_index && (h[i] < 0 || h[i] >= r.cols))
            throw InputError(
                fmt::format("class id {} at position {} is out of range for {} classes", h[i], i, r.cols));
    const Launch l = rows_launch(r.rows, r.cols);
    if (!l.grid) return 0.0;
    const Tensor t64 = device_ids(h);
    Tensor row_loss({r.rows}, DType::float64, Device::cuda);
    dispatch(logits.dtype(), [&](auto tag) {
        using D = decltype(tag);
        cross_entropy_kernel<D><<<l.grid, l.block, 0, stream()>>>(ptr<D>(logits), ptr<int64_t>(t64),
                                                                  ptr<D>(dlogits), ptr<double>(row_loss),
                                                                  r.rows, r.cols, ignore_index, divisor);
    });
    check_launch();
    const std::vector<double> losses = row_loss.to_doubles();  // rows in order, as the CPU sums them
    double loss = 0.0;
    for (double v : losses) loss += v;
    return in_acc_type(loss / divisor, logits.dtype());
}

double CudaBackend::mse(const Tensor& out, const Tensor& target, double divisor, Tensor& dout) {
    require_same_shape(out, target, "mse");
    if (out.numel() == 0) return 0.0;
    Tensor loss({}, DType::float64, Device::cuda);
    dispatch(out.dtype(), [&](auto tag) {
        using D = decltype(tag);
        mse_kernel<D><<<1, 1024, 0, stream()>>>(ptr<D>(out), ptr<D>(target), ptr<D>(dout), out.numel(),
                                                divisor, ptr<double>(loss));
    });
    check_launch();
    return in_acc_type(loss.item() / divisor, out.dtype());
}

}  // namespace ptool
