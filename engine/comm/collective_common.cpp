// What every communicator shares: chunking, rank-ordered reduction, collective descriptors.
#include <algorithm>
#include <cstring>
#include <iterator>

#include "comm/communicator.h"

namespace ptool {
namespace {
const char* const kOps[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                            "all_to_all", "barrier",    "split",          "init"};
}

const char* reduce_op_name(ReduceOp op) {
    switch (op) {
        case ReduceOp::sum:
            return "sum";
        case ReduceOp::avg:
            return "avg";
        case ReduceOp::max:
            return "max";
    }
    return "?";
}

int64_t row_numel(const Tensor& t) {
    int64_t row = 1;
    for (int64_t d = 1; d < t.dim(); ++d) row *= t.shape()[d];
    return row;
}

RowChunk reduce_scatter_rows(const Tensor& in, const Tensor& out, int parts, int index) {
    const int64_t rows = in.dim() ? in.size(0) : 1, row = row_numel(in);
    const Chunk c = chunk_of(rows, parts, index);
    PTOOL_REQUIRE(out.numel() == c.length * row, "reduce_scatter: output {} for a chunk of {} rows of {}",
                  shape_str(out.shape()), c.length, row);
    return {rows, row, c};
}

void reduce_in_rank_order(const std::vector<const void*>& inputs, const std::vector<void*>& outs,
                          int64_t count, DType dtype, ReduceOp op) {
    const int n = static_cast<int>(inputs.size());
    dispatch_float(dtype, [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        constexpr int64_t kBlock = 4096;  // accumulate a block in acc_t, then round once
        A acc[kBlock];
        for (int64_t start = 0; start < count; start += kBlock) {
            const int64_t len = std::min(kBlock, count - start);
            const T* first = static_cast<const T*>(inputs[0]) + start;
            for (int64_t i = 0; i < len; ++i) acc[i] = A(first[i]);
            for (int r = 1; r < n; ++r) {
                const T* in = static_cast<const T*>(inputs[r]) + start;
                if (op == ReduceOp::max) {
                    for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], A(in[i]));
                } else {
                    for (int64_t i = 0; i < len; ++i) acc[i] += A(in[i]);
                }
            }
            if (op == ReduceOp::avg)
                for (int64_t i = 0; i < len; ++i) acc[i] /= A(n);
            for (void* out : outs) {  // block by block: safe when an out aliases an input
                T* o = static_cast<T*>(out) + start;
                for (int64_t i = 0; i < len; ++i) o[i] = T(acc[i]);
            }
        }
    });
}

bool CollectiveDesc::matches(const CollectiveDesc& o) const {
    if (op != o.op || dtype != o.dtype || ndim != o.ndim || sequence != o.sequence || root != o.root)
        return false;
    for (int i = shape_free ? 1 : 0; i < ndim; ++i)
        if (dims[i] != o.dims[i]) return false;
    return true;
}

std::string CollectiveDesc::str() const {
    std::string shape = "[";
    for (int i = 0; i < ndim; ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
    shape += "]";
    return fmt::format("{}#{} {} {}", kOps[op], sequence, dtype_name(static_cast<DType>(dtype)), shape);
}

CollectiveDesc describe(const char* op, int64_t sequence) {
    CollectiveDesc d;
    const auto it = std::find_if(std::begin(kOps), std::end(kOps),
                                 [&](const char* name) { return std::strcmp(name, op) == 0; });
    PTOOL_REQUIRE(it != std::end(kOps), "describe: unknown collective {}", op);
    d.op = static_cast<int>(it - std::begin(kOps));
    d.sequence = sequence;
    return d;
}

CollectiveDesc describe(const char* op, const Tensor& t, int64_t sequence, int64_t root, bool dim0_free) {
    CollectiveDesc d = describe(op, sequence);
    d.dtype = static_cast<int>(t.dtype());
    d.ndim = static_cast<int>(std::min<int64_t>(8, t.dim()));
    for (int i = 0; i < d.ndim; ++i) d.dims[i] = t.shape()[i];
    d.root = root;
    d.shape_free = dim0_free;
    return d;
}

}  // namespace ptool
