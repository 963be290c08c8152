#include "model/selective_recompute.h"

#include <atomic>

#include "core/error.h"
#include "model/module.h"

namespace ptool {

KeptOutput kept_output(RunContext& ctx, SelectiveOp op) {
    if (!ctx.selective) return KeptOutput::none;
    bool kept = op == SelectiveOp::attention;
    if (op == SelectiveOp::mm) kept = ++ctx.selective->matmuls % 2 == 1;  // every other matmul: 1st, 3rd, ...
    if (!kept) return KeptOutput::none;
    return ctx.recomputing ? KeptOutput::take : KeptOutput::keep;
}

uint64_t next_selective_call() {
    static std::atomic<uint64_t> next{0};
    return ++next;
}

void KeptOutputs::keep(const RunContext& ctx, const Tensor& y) {
    const Key key{ctx.microbatch, ctx.selective->call};
    kept_[key].push_back(y);
    last_[ctx.microbatch] = key;
}

Tensor KeptOutputs::take(const RunContext& ctx) {
    auto it = kept_.find({ctx.microbatch, ctx.selective->call});
    PTOOL_REQUIRE(it != kept_.end() && !it->second.empty(),
                  "selective recompute: no output kept for microbatch {}", ctx.microbatch);
    Tensor y = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) kept_.erase(it);
    return y;
}

Tensor* KeptOutputs::last(int microbatch) {
    auto at = last_.find(microbatch);
    if (at == last_.end()) return nullptr;
    auto it = kept_.find(at->second);
    return it == kept_.end() || it->second.empty() ? nullptr : &it->second.back();
}

}  // namespace ptool
