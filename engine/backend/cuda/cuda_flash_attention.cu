// Flash attention on the GPU (Backend::attention_forward / attention_backward): every head and
// query row of a layer in one launch forward, two backward, instead of the tile path's kernels per
// head and row tile (model/modules/attention.cpp, the CPU's oracle).
//
// The three kernels share one pattern (FlashAttention-2's, on CUDA cores): a block holds 32 rows
// (4 warps x 8 rows, each warp carrying its rows' running state in registers) and walks the other
// side's vectors 32 at a time through shared memory, one a lane: lane j forms its column's dot
// products with the row, and the row's accumulators (each lane owns head dims lane, lane + 32, ...)
// take the 32 columns' terms broadcast in order (shuffles). So every sum has one fixed order (no
// atomics: the run is bitwise reproducible, backend/cuda/cuda_backend.h):
//   forward   rows = queries, columns = keys:    online softmax (m, l), o = sum p v / l
//   dq        rows = queries, columns = keys:    p = exp(s - m) / l, ds = p (d_o . v - D), dq = scale sum ds
//   k;
//             D = o . d_o per row, kept for the next kernel
//   dk, dv    rows = keys (of one kv head), columns = the queries of every query head that reads it:
//             dv = sum p d_o, dk = scale sum ds q
// Scores are formed in the same order in all three (c = 0 .. hd-1), so backward's p is forward's.
// Accumulation is in float (double for float64); 16-bit values are rounded once, on store.
// Column blocks a causal block cannot see are skipped whole.
#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace ptool {
namespace {
using namespace ptool::cuda;

constexpr int kWarps = 4, kRowsPerWarp = 8, kRows = kWarps * kRowsPerWarp, kCols = 32;
constexpr int kMaxHeadDim = 256;

struct Geometry {
    int64_t batch, heads, kv_heads, t, s, hd;
    bool causal, o_merged;
    const int64_t* qpos;  // null: i + s - t
    const int64_t* kpos;  // null: j
    __device__ int64_t query_pos(int64_t i) const { return qpos ? qpos[i] : i + s - t; }
    __device__ int64_t key_pos(int64_t j) const { return kpos ? kpos[j] : j; }
    __device__ int64_t group() const { return heads / kv_heads; }
    // element offsets of row i of query head bh (q, dq: [B*H, T, hd]; o, d_o also [B, T, H*hd])
    __device__ int64_t q_row(int64_t bh, int64_t i) const { return (bh * t + i) * hd; }
    __device__ int64_t o_row(int64_t bh, int64_t i) const {
        return o_merged ? ((bh / heads * t + i) * heads + bh % heads) * hd : q_row(bh, i);
    }
    __device__ int64_t kv_row(int64_t kvh, int64_t j) const { return (kvh * s + j) * hd; }
    __device__ int64_t kv_of(int64_t bh) const { return bh / heads * kv_heads + bh % heads / group(); }
};

template <class A>
__device__ A warp_max(A v) {
    for (int o = 16; o > 0; o /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <class A>
__device__ A warp_sum(A v) {
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// sum_c x[c] y[c], c in order
template <class A>
__device__ A dot(const A* x, const A* y, int64_t n) {
    A s = 0;
    for (int64_t c = 0; c < n; ++c) s += x[c] * y[c];
    return s;
}

// rows [r0, r0 + n) of a [.., hd] tensor into shared memory with row pitch `pitch` (zeros past `limit`)
template <class D, class A, class Row>
__device__ void stage(A* dst, int pitch, const D* src, Row row, int64_t r0, int n, int64_t limit,
                      int64_t hd) {
    for (int64_t e = threadIdx.x; e < n * hd; e += blockDim.x) {
        const int64_t r = e / hd, c = e % hd;
        dst[r * pitch + c] = r0 + r < limit ? to_acc(src[row(r0 + r) + c]) : A(0);
    }
}

// The largest query position of rows [r0, r0 + n) and the smallest key position of keys [c0, c0 + n):
// a column block whose keys all sit after every row's query is skipped (causal).
__device__ int64_t max_query_pos(const Geometry& g, int64_t r0, int n) {
    int64_t p = std::numeric_limits<int64_t>::min();
    for (int64_t i = r0; i < min(g.t, r0 + n); ++i) p = max(p, g.query_pos(i));
    return p;
}
__device__ int64_t min_key_pos(const Geometry& g, int64_t c0, int n) {
    int64_t p = std::numeric_limits<int64_t>::max();
    for (int64_t j = c0; j < min(g.s, c0 + n); ++j) p = min(p, g.key_pos(j));
    return p;
}

template <class D, int K>
__global__ void __launch_bounds__(kWarps * 32)
    flash_forward_kernel(Geometry g, double scale_d, const D* q, const D* k, const D* v, D* o,
                         dacc_t<D>* m_out, dacc_t<D>* l_out) {
    using A = dacc_t<D>;
    constexpr A kNegInf = -std::numeric_limits<A>::infinity();
    extern __shared__ __align__(16) unsigned char smem[];
    const int64_t hd = g.hd;
    A* qs = reinterpret_cast<A*>(smem);  // [kRows][hd]
    A* ks = qs + kRows * hd;             // [kCols][hd + 1]: lane j reads row j
    A* vs = ks + kCols * (hd + 1);       // [kCols][hd]: lanes read one row's dims
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const A scale = A(scale_d);
    const int64_t r0 = int64_t{blockIdx.x} * kRows;
    for (int64_t bh = blockIdx.y; bh < g.batch * g.heads; bh += gridDim.y) {
        const int64_t kvh = g.kv_of(bh);
        __syncthreads();  // the previous head's tiles are read
        stage<D>(
            qs, static_cast<int>(hd), q, [&](int64_t i) { return g.q_row(bh, i); }, r0, kRows, g.t, hd);
        A m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][K];
        int64_t qp[kRowsPerWarp];
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t i = r0 + warp * kRowsPerWarp + rr;
            m[rr] = kNegInf, l[rr] = 0, qp[rr] = i < g.t ? g.query_pos(i) : 0;
#pragma unroll
            for (int kk = 0; kk < K; ++kk) acc[rr][kk] = 0;
        }
        const int64_t block_qmax = g.causal ? max_query_pos(g, r0, kRows) : 0;
        for (int64_t c0 = 0; c0 < g.s; c0 += kCols) {
            if (g.causal && min_key_pos(g, c0, kCols) > block_qmax) continue;  // the same on every thread
            __syncthreads();
            stage<D>(
                ks, static_cast<int>(hd + 1), k, [&](int64_t j) { return g.kv_row(kvh, j); }, c0, kCols, g.s,
                hd);
            stage<D>(
                vs, static_cast<int>(hd), v, [&](int64_t j) { return g.kv_row(kvh, j); }, c0, kCols, g.s, hd);
            __syncthreads();
            const int64_t j = c0 + lane;
            const int64_t kp = j < g.s ? g.key_pos(j) : 0;
#pragma unroll
            for (int rr = 0; rr < kRowsPerWarp; ++rr) {
                const int r = warp * kRowsPerWarp + rr;
                if (r0 + r >= g.t) continue;  // the same on every lane
                const bool seen = j < g.s && (!g.causal || kp <= qp[rr]);
                const A sc = seen ? dot(qs + r * hd, ks + lane * (hd + 1), hd) * scale : kNegInf;
                const A m_new = max(m[rr], warp_max(sc));
                if (m_new == kNegInf) continue;  // nothing seen yet: the same on every lane
                const A p = seen ? exp(sc - m_new) : A(0), corr = exp(m[rr] - m_new);
                l[rr] = l[rr] * corr + warp_sum(p);
#pragma unroll
                for (int kk = 0; kk < K; ++kk) acc[rr][kk] *= corr;
                for (int jj = 0; jj < kCols; ++jj) {
                    const A pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
                    for (int kk = 0; kk < K; ++kk) {
                        const int64_t d = lane + 32 * kk;
                        if (d < hd) acc[rr][kk] += pj * vs[jj * hd + d];
                    }
                }
                m[rr] = m_new;
            }
        }
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t i = r0 + warp * kRowsPerWarp + rr;
            if (i >= g.t) continue;
#pragma unroll
            for (int kk = 0; kk < K; ++kk) {
                const int64_t d = lane + 32 * kk;
                if (d < hd) o[g.o_row(bh, i) + d] = from_acc<D>(l[rr] > 0 ? acc[rr][kk] / l[rr] : A(0));
            }
            if (lane == 0) m_out[bh * g.t + i] = m[rr], l_out[bh * g.t + i] = l[rr];
        }
    }
}

// dq (+)= scale ds k over every key; writes each row's D = o . d_o for the dk/dv kernel.
template <class D, int K>
__global__ void __launch_bounds__(kWarps * 32)
    flash_dq_kernel(Geometry g, double scale_d, const D* q, const D* k, const D* v, const D* o, const D* d_o,
                    const dacc_t<D>* m_in, const dacc_t<D>* l_in, D* dq, dacc_t<D>* d_out, bool accumulate) {
    using A = dacc_t<D>;
    constexpr A kNegInf = -std::numeric_limits<A>::infinity();
    extern __shared__ __align__(16) unsigned char smem[];
    const int64_t hd = g.hd;
    A* qs = reinterpret_cast<A*>(smem);  // [kRows][hd]
    A* dos = qs + kRows * hd;            // [kRows][hd]
    A* ks = dos + kRows * hd;            // [kCols][hd + 1]
    A* vs = ks + kCols * (hd + 1);       // [kCols][hd + 1]
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const A scale = A(scale_d);
    const int64_t r0 = int64_t{blockIdx.x} * kRows;
    for (int64_t bh = blockIdx.y; bh < g.batch * g.heads; bh += gridDim.y) {
        const int64_t kvh = g.kv_of(bh);
        __syncthreads();
        stage<D>(
            qs, static_cast<int>(hd), q, [&](int64_t i) { return g.q_row(bh, i); }, r0, kRows, g.t, hd);
        stage<D>(
            dos, static_cast<int>(hd), d_o, [&](int64_t i) { return g.o_row(bh, i); }, r0, kRows, g.t, hd);
        A m[kRowsPerWarp], l[kRowsPerWarp], dd[kRowsPerWarp], acc[kRowsPerWarp][K];
        int64_t qp[kRowsPerWarp];
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t i = r0 + warp * kRowsPerWarp + rr;
            const bool valid = i < g.t;
            m[rr] = valid ? m_in[bh * g.t + i] : kNegInf, l[rr] = valid ? l_in[bh * g.t + i] : A(0);
            qp[rr] = valid ? g.query_pos(i) : 0;
            A part = 0;  // D: the lanes' dims, then the warp's sum
#pragma unroll
            for (int kk = 0; kk < K; ++kk) {
                const int64_t d = lane + 32 * kk;
                acc[rr][kk] = 0;
                if (valid && d < hd) part += to_acc(o[g.o_row(bh, i) + d]) * to_acc(d_o[g.o_row(bh, i) + d]);
            }
            dd[rr] = warp_sum(part);
            if (valid && lane == 0) d_out[bh * g.t + i] = dd[rr];
        }
        const int64_t block_qmax = g.causal ? max_query_pos(g, r0, kRows) : 0;
        for (int64_t c0 = 0; c0 < g.s; c0 += kCols) {
            if (g.causal && min_key_pos(g, c0, kCols) > block_qmax) continue;
            __syncthreads();
            stage<D>(
                ks, static_cast<int>(hd + 1), k, [&](int64_t j) { return g.kv_row(kvh, j); }, c0, kCols, g.s,
                hd);
            stage<D>(
                vs, static_cast<int>(hd + 1), v, [&](int64_t j) { return g.kv_row(kvh, j); }, c0, kCols, g.s,
                hd);
            __syncthreads();
            const int64_t j = c0 + lane;
            const int64_t kp = j < g.s ? g.key_pos(j) : 0;
#pragma unroll
            for (int rr = 0; rr < kRowsPerWarp; ++rr) {
                const int r = warp * kRowsPerWarp + rr;
                if (r0 + r >= g.t || !(l[rr] > 0)) continue;  // a row that sees no key has no gradient
                const bool seen = j < g.s && (!g.causal || kp <= qp[rr]);
                const A sc = seen ? dot(qs + r * hd, ks + lane * (hd + 1), hd) * scale : kNegInf;
                const A p = seen ? exp(sc - m[rr]) / l[rr] : A(0);
                const A dp = seen ? dot(dos + r * hd, vs + lane * (hd + 1), hd) : A(0);
                const A ds = p * (dp - dd[rr]);
                for (int jj = 0; jj < kCols; ++jj) {
                    const A dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
                    for (int kk = 0; kk < K; ++kk) {
                        const int64_t d = lane + 32 * kk;
                        if (d < hd) acc[rr][kk] += dsj * ks[jj * (hd + 1) + d];
                    }
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t i = r0 + warp * kRowsPerWarp + rr;
            if (i >= g.t) continue;
#pragma unroll
            for (int kk = 0; kk < K; ++kk) {
                const int64_t d = lane + 32 * kk;
                if (d >= hd) continue;
                D& out = dq[g.q_row(bh, i) + d];
                out = from_acc<D>((accumulate ? to_acc(out) : A(0)) + scale * acc[rr][kk]);
            }
        }
    }
}

// dk = scale sum ds q, dv = sum p d_o for the keys of one kv head, over the queries of every query
// head that reads it (in head order, then row order).
template <class D, int K>
__global__ void __launch_bounds__(kWarps * 32)
    flash_dkdv_kernel(Geometry g, double scale_d, const D* q, const D* k, const D* v, const D* d_o,
                      const dacc_t<D>* m_in, const dacc_t<D>* l_in, const dacc_t<D>* d_in, D* dk, D* dv) {
    using A = dacc_t<D>;
    constexpr A kNegInf = -std::numeric_limits<A>::infinity();
    extern __shared__ __align__(16) unsigned char smem[];
    const int64_t hd = g.hd;
    A* ks = reinterpret_cast<A*>(smem);  // [kRows][hd]: this block's keys
    A* vs = ks + kRows * hd;             // [kRows][hd]
    A* qs = vs + kRows * hd;             // [kCols][hd + 1]: lane i reads query i
    A* dos = qs + kCols * (hd + 1);      // [kCols][hd + 1]
    A* stats = dos + kCols * (hd + 1);   // m, l, D of the 32 queries
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const A scale = A(scale_d);
    const int64_t c0r = int64_t{blockIdx.x} * kRows, group = g.group();
    for (int64_t kvh = blockIdx.y; kvh < g.batch * g.kv_heads; kvh += gridDim.y) {
        __syncthreads();
        stage<D>(
            ks, static_cast<int>(hd), k, [&](int64_t j) { return g.kv_row(kvh, j); }, c0r, kRows, g.s, hd);
        stage<D>(
            vs, static_cast<int>(hd), v, [&](int64_t j) { return g.kv_row(kvh, j); }, c0r, kRows, g.s, hd);
        A dk_acc[kRowsPerWarp][K], dv_acc[kRowsPerWarp][K];
        int64_t kp[kRowsPerWarp];
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t j = c0r + warp * kRowsPerWarp + rr;
            kp[rr] = j < g.s ? g.key_pos(j) : 0;
#pragma unroll
            for (int kk = 0; kk < K; ++kk) dk_acc[rr][kk] = 0, dv_acc[rr][kk] = 0;
        }
        const int64_t block_kmin = g.causal ? min_key_pos(g, c0r, kRows) : 0;
        const int64_t b = kvh / g.kv_heads, first_head = b * g.heads + kvh % g.kv_heads * group;
        for (int64_t bh = first_head; bh < first_head + group; ++bh) {
            for (int64_t i0 = 0; i0 < g.t; i0 += kCols) {
                if (g.causal && max_query_pos(g, i0, kCols) < block_kmin) continue;
                __syncthreads();
                stage<D>(
                    qs, static_cast<int>(hd + 1), q, [&](int64_t i) { return g.q_row(bh, i); }, i0, kCols,
                    g.t, hd);
                stage<D>(
                    dos, static_cast<int>(hd + 1), d_o, [&](int64_t i) { return g.o_row(bh, i); }, i0, kCols,
                    g.t, hd);
                if (threadIdx.x < kCols) {
                    const int64_t i = i0 + threadIdx.x;
                    const bool valid = i < g.t;
                    stats[threadIdx.x] = valid ? m_in[bh * g.t + i] : kNegInf;
                    stats[kCols + threadIdx.x] = valid ? l_in[bh * g.t + i] : A(0);
                    stats[2 * kCols + threadIdx.x] = valid ? d_in[bh * g.t + i] : A(0);
                }
                __syncthreads();
                const int64_t i = i0 + lane;
                const bool query = i < g.t;
                const int64_t qp = query ? g.query_pos(i) : 0;
                const A mi = stats[lane], li = stats[kCols + lane], di = stats[2 * kCols + lane];
#pragma unroll
                for (int rr = 0; rr < kRowsPerWarp; ++rr) {
                    const int r = warp * kRowsPerWarp + rr;
                    if (c0r + r >= g.s) continue;
                    const bool seen = query && li > 0 && (!g.causal || kp[rr] <= qp);
                    const A sc = seen ? dot(qs + lane * (hd + 1), ks + r * hd, hd) * scale : kNegInf;
                    const A p = seen ? exp(sc - mi) / li : A(0);
                    const A dp = seen ? dot(dos + lane * (hd + 1), vs + r * hd, hd) : A(0);
                    const A ds = p * (dp - di);
                    for (int ii = 0; ii < kCols; ++ii) {
                        const A pi = __shfl_sync(0xffffffffu, p, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
#pragma unroll
                        for (int kk = 0; kk < K; ++kk) {
                            const int64_t d = lane + 32 * kk;
                            if (d < hd) {
                                dv_acc[rr][kk] += pi * dos[ii * (hd + 1) + d];
                                dk_acc[rr][kk] += dsi * qs[ii * (hd + 1) + d];
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < kRowsPerWarp; ++rr) {
            const int64_t j = c0r + warp * kRowsPerWarp + rr;
            if (j >= g.s) continue;
#pragma unroll
            for (int kk = 0; kk < K; ++kk) {
                const int64_t d = lane + 32 * kk;
                if (d >= hd) continue;
                dk[g.kv_row(kvh, j) + d] = from_acc<D>(scale * dk_acc[rr][kk]);
                dv[g.kv_row(kvh, j) + d] = from_acc<D>(dv_acc[rr][kk]);
            }
        }
    }
}

// Shared memory of each kernel, in accumulate-type elements.
int64_t forward_smem(int64_t hd) {
    return kRows * hd + kCols * (hd + 1) + kCols * hd;
}
int64_t dq_smem(int64_t hd) {
    return 2 * kRows * hd + 2 * kCols * (hd + 1);
}
int64_t dkdv_smem(int64_t hd) {
    return 2 * kRows * hd + 2 * kCols * (hd + 1) + 3 * kCols;
}

int max_smem_bytes() {
    static const int bytes = [] {
        int device = 0, v = 0;
        PTOOL_CHECK_CUDA(cudaGetDevice(&device));
        PTOOL_CHECK_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        return v;
    }();
    return bytes;
}

// A kernel's launch: its dynamic shared memory allowed above the default 48 KiB where it needs more.
template <class Kernel, class... Args>
void launch(Kernel kernel, dim3 grid, size_t smem, Args... args) {
    if (grid.x == 0 || grid.y == 0) return;
    PTOOL_CHECK_CUDA(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    kernel<<<grid, kWarps * 32, smem, stream()>>>(args...);
    check_launch();
}

// Calls f(std::integral_constant<int, K>) with K the head dims a lane owns: 2, 4 or 8 (three sizes:
// each is 3 kernels x 3 dtypes to compile).
template <class F>
void dispatch_lanes(int64_t hd, F&& f) {
    if (hd <= 64)
        f(std::integral_constant<int, 2>{});
    else if (hd <= 128)
        f(std::integral_constant<int, 4>{});
    else
        f(std::integral_constant<int, 8>{});
}

dim3 grid_of(int64_t rows, int64_t heads) {
    return dim3(static_cast<unsigned>((rows + kRows - 1) / kRows),
                static_cast<unsigned>(std::min<int64_t>(heads, kMaxGrid)));
}

Geometry geometry(const AttentionArgs& a, const Tensor& q, const Tensor& k) {
    PTOOL_REQUIRE(a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0,
                  "attention: {} heads over {} kv heads", a.heads, a.kv_heads);
    PTOOL_REQUIRE(q.dim() == 3 && k.dim() == 3 && q.size(0) == a.batch * a.heads &&
                      k.size(0) == a.batch * a.kv_heads && q.size(2) == k.size(2),
                  "attention: q {} k {} for batch {}, {} heads, {} kv heads", shape_str(q.shape()),
                  shape_str(k.shape()), a.batch, a.heads, a.kv_heads);
    const int64_t t = q.size(1), s = k.size(1);
    for (const auto& [pos, n, what] :
         {std::tuple{&a.query_pos, t, "query"}, std::tuple{&a.key_pos, s, "key"}})
        PTOOL_REQUIRE(!pos->defined() || (pos->numel() == n && pos->dtype() == DType::int64 &&
                                          pos->device() == Device::cuda),
                      "attention: {} positions must be {} int64 on the device", what, n);
    return {a.batch,
            a.heads,
            a.kv_heads,
            t,
            s,
            q.size(2),
            a.causal,
            a.o_merged,
            a.query_pos.defined() ? ptr<int64_t>(a.query_pos) : nullptr,
            a.key_pos.defined() ? ptr<int64_t>(a.key_pos) : nullptr};
}

}  // namespace

// The dtypes the kernels are built for (float16 runs the tile path).
template <class F>
void dispatch_fused(DType dt, F&& f) {
    if (dt == DType::float32)
        f(float{});
    else if (dt == DType::float64)
        f(double{});
    else
        f(__nv_bfloat16{});
}

bool CudaBackend::fused_attention(DType dt, int64_t head_dim) const {
    if ((dt != DType::float32 && dt != DType::float64 && dt != DType::bfloat16) || head_dim <= 0 ||
        head_dim > kMaxHeadDim)
        return false;
    const int64_t bytes = std::max({forward_smem(head_dim), dq_smem(head_dim), dkdv_smem(head_dim)}) *
                          static_cast<int64_t>(dtype_size(acc_dtype(dt)));
    return bytes <= max_smem_bytes();
}

void CudaBackend::attention_forward(const AttentionArgs& a, const Tensor& q, const Tensor& k, const Tensor& v,
                                    Tensor& o, Tensor& m, Tensor& l) {
    const Geometry g = geometry(a, q, k);
    PTOOL_REQUIRE(fused_attention(q.dtype(), g.hd), "attention: no fused kernel for {} with head dim {}",
                  dtype_name(q.dtype()), g.hd);
    PTOOL_REQUIRE(o.numel() == q.numel() && m.numel() == g.batch * g.heads * g.t && l.numel() == m.numel() &&
                      v.shape() == k.shape(),
                  "attention_forward: o {} m {} l {} v {} for q {}", shape_str(o.shape()),
                  shape_str(m.shape()), shape_str(l.shape()), shape_str(v.shape()), shape_str(q.shape()));
    dispatch_fused(q.dtype(), [&](auto tag) {
        using D = decltype(tag);
        using A = dacc_t<D>;
        dispatch_lanes(g.hd, [&](auto lanes) {
            launch(flash_forward_kernel<D, decltype(lanes)::value>, grid_of(g.t, g.batch * g.heads),
                   forward_smem(g.hd) * sizeof(A), g, a.scale, ptr<D>(q), ptr<D>(k), ptr<D>(v), ptr<D>(o),
                   ptr<A>(m), ptr<A>(l));
        });
    });
}

void CudaBackend::attention_backward(const AttentionArgs& a, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& o, const Tensor& d_o, const Tensor& m,
                                     const Tensor& l, Tensor& dq, Tensor& dk, Tensor& dv,
                                     bool accumulate_dq) {
    const Geometry g = geometry(a, q, k);
    PTOOL_REQUIRE(fused_attention(q.dtype(), g.hd), "attention: no fused kernel for {} with head dim {}",
                  dtype_name(q.dtype()), g.hd);
    PTOOL_REQUIRE(dq.shape() == q.shape() && dk.shape() == k.shape() && dv.shape() == k.shape() &&
                      o.numel() == q.numel() && d_o.numel() == q.numel(),
                  "attention_backward: dq {} dk {} dv {} for q {} k {}", shape_str(dq.shape()),
                  shape_str(dk.shape()), shape_str(dv.shape()), shape_str(q.shape()), shape_str(k.shape()));
    Tensor dd = Tensor::empty(m.shape(), m.dtype(), Device::cuda);  // each row's D, from the dq kernel
    dispatch_fused(q.dtype(), [&](auto tag) {
        using D = decltype(tag);
        using A = dacc_t<D>;
        dispatch_lanes(g.hd, [&](auto lanes) {
            constexpr int K = decltype(lanes)::value;
            launch(flash_dq_kernel<D, K>, grid_of(g.t, g.batch * g.heads), dq_smem(g.hd) * sizeof(A), g,
                   a.scale, ptr<D>(q), ptr<D>(k), ptr<D>(v), ptr<D>(o), ptr<D>(d_o), ptr<A>(m), ptr<A>(l),
                   ptr<D>(dq), ptr<A>(dd), accumulate_dq);
            launch(flash_dkdv_kernel<D, K>, grid_of(g.s, g.batch * g.kv_heads), dkdv_smem(g.hd) * sizeof(A),
                   g, a.scale, ptr<D>(q), ptr<D>(k), ptr<D>(v), ptr<D>(d_o), ptr<A>(m), ptr<A>(l), ptr<A>(dd),
                   ptr<D>(dk), ptr<D>(dv));
        });
    });
}

}  // namespace ptool
