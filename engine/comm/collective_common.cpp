// What every communicator shares: chunking, rank-ordered reduction, collective descriptors.
#include <algorithm>
#include <cstring>
#include <iterator>

#include "comm/communicator.h"

namespace ptool {
namespace {
// What a descriptor names beyond the collectives' table (comm/collective.h): its op is kCollectives
// plus the index here
const char* const kOtherOps[] = {"barrier", "split", "init", "all_to_all_v"};

const char* desc_op_name(int op) {
    return op < kCollectives ? collective_name(static_cast<Collective>(op)) : kOtherOps[op - kCollectives];
}
}  // namespace

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

void check_all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                        const std::vector<int64_t>& recv_rows, int size) {
    PTOOL_REQUIRE(static_cast<int>(send_rows.size()) == size && static_cast<int>(recv_rows.size()) == size,
                  "all_to_all_v: {} send and {} recv splits for {} ranks", send_rows.size(), recv_rows.size(),
                  size);
    int64_t sent = 0, received = 0;
    for (int j = 0; j < size; ++j) {
        PTOOL_REQUIRE(send_rows[j] >= 0 && recv_rows[j] >= 0, "all_to_all_v: a negative split for rank {}",
                      j);
        sent += send_rows[j], received += recv_rows[j];
    }
    const int64_t in_rows = in.dim() ? in.size(0) : 1, out_rows = out.dim() ? out.size(0) : 1;
    PTOOL_REQUIRE(sent == in_rows && received == out_rows,
                  "all_to_all_v: splits of {} rows to send and {} to receive for {} and {}", sent, received,
                  shape_str(in.shape()), shape_str(out.shape()));
    PTOOL_REQUIRE(row_numel(in) == row_numel(out) && in.dtype() == out.dtype() && in.device() == out.device(),
                  "all_to_all_v: rows of {} {} cannot land in {} {}", dtype_name(in.dtype()),
                  shape_str(in.shape()), dtype_name(out.dtype()), shape_str(out.shape()));
}

std::string all_to_all_v_mismatch(const std::vector<std::vector<int64_t>>& sends,
                                  const std::vector<std::vector<int64_t>>& recvs,
                                  const std::function<int(int)>& world) {
    const size_t n = sends.size();
    for (size_t r = 0; r < n; ++r)
        for (size_t j = 0; j < n; ++j)
            if (sends[r][j] != recvs[j][r])
                return fmt::format(
                    "all_to_all_v split mismatch: rank {} sends {} rows to rank {}, which expects {}",
                    world(static_cast<int>(r)), sends[r][j], world(static_cast<int>(j)), recvs[j][r]);
    return "";
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
    return fmt::format("{}#{} {} {}", desc_op_name(op), sequence, dtype_name(static_cast<DType>(dtype)),
                       shape);
}

CollectiveDesc describe(const char* op, int64_t sequence) {
    CollectiveDesc d;
    d.sequence = sequence;
    if (const std::optional<Collective> c = collective_named(op)) return d.op = static_cast<int>(*c), d;
    const auto it = std::find_if(std::begin(kOtherOps), std::end(kOtherOps),
                                 [&](const char* name) { return std::strcmp(name, op) == 0; });
    PTOOL_REQUIRE(it != std::end(kOtherOps), "describe: unknown collective {}", op);
    d.op = kCollectives + static_cast<int>(it - std::begin(kOtherOps));
    return d;
}

namespace {
CollectiveDesc with_tensor(CollectiveDesc d, const Tensor& t, int64_t root, bool dim0_free) {
    d.dtype = static_cast<int>(t.dtype());
    d.ndim = static_cast<int>(std::min<int64_t>(8, t.dim()));
    for (int i = 0; i < d.ndim; ++i) d.dims[i] = t.shape()[i];
    d.root = root;
    d.shape_free = dim0_free;
    return d;
}
}  // namespace

CollectiveDesc describe(const char* op, const Tensor& t, int64_t sequence, int64_t root, bool dim0_free) {
    return with_tensor(describe(op, sequence), t, root, dim0_free);
}

CollectiveDesc describe(Collective op, const Tensor& t, int64_t sequence, int64_t root, bool dim0_free) {
    return with_tensor(describe(collective_name(op), sequence), t, root, dim0_free);
}

}  // namespace ptool
