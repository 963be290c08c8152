// Launch sizes for the CUDA kernels, as plain host arithmetic (unit-tested without a GPU).
//
//   elementwise: grid-stride loops; 256 threads a block, at most 32 blocks per SM (enough to
//     fill an H100 with 132 SMs), at least one block; n == 0 launches nothing.
//   rows: one block per row for row reductions (norms, softmax, losses); the block is the
//     smallest power of two >= the row length, between 32 (a warp) and 1024 threads; rows beyond
//     the grid limit are covered by a loop in the kernel (grid-stride over rows).
#pragma once

#include <algorithm>
#include <cstdint>

namespace ptool::cuda {

struct Launch {
    uint32_t grid = 0;  // 0: nothing to launch
    uint32_t block = 0;
};

constexpr uint32_t kElementwiseBlock = 256;
constexpr int64_t kMaxGrid =
    65535;  // rows per launch: grid.x could be larger, but this is plenty with a loop

inline Launch elementwise_launch(int64_t n, int sm_count) {
    if (n <= 0) return {};
    const int64_t blocks = (n + kElementwiseBlock - 1) / kElementwiseBlock;
    const int64_t cap = std::max<int64_t>(1, int64_t{sm_count} * 32);
    return {static_cast<uint32_t>(std::min(blocks, cap)), kElementwiseBlock};
}

inline uint32_t row_block(int64_t cols) {
    uint32_t b = 32;
    while (b < 1024 && b < cols) b *= 2;
    return b;
}

inline Launch rows_launch(int64_t rows, int64_t cols) {
    if (rows <= 0) return {};
    return {static_cast<uint32_t>(std::min(rows, kMaxGrid)), row_block(cols)};
}

// Bytes of shared memory a row block needs for a tree reduction of `values` accumulators per thread.
inline size_t reduction_shared_bytes(uint32_t block, int values, size_t acc_bytes) {
    return static_cast<size_t>(block / 32) * static_cast<size_t>(values) * acc_bytes;
}

}  // namespace ptool::cuda
