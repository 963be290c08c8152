#include "model/selective_recompute.h"

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

Tensor KeptOutputs::take(int microbatch) {
    auto it = kept_.find(microbatch);
    PTOOL_REQUIRE(it != kept_.end() && !it->second.empty(),
                  "selective recompute: no output kept for microbatch {}", microbatch);
    Tensor y = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) kept_.erase(it);
    return y;
}

}  // namespace ptool
