#include "model/attention_core.h"
#include "plan/explain.h"

namespace ptool {
namespace {

// The ring's hops of one attention (model/modules/attention_ring.cpp), each a send and a recv of a
// block of `block` bytes: forward, cp - 1 hops of keys and values (again when recomputed); backward,
// cp - 1 hops of keys, values and their gradients, then one of the gradients home.
void ring_comm(const std::string& fqn, int64_t block, int cp, bool recomputed, std::vector<CommCost>& forward,
               std::vector<CommCost>& backward) {
    auto hop = [&](std::vector<CommCost>& into, int tensors, Phase phase) {
        for (int i = 0; i < tensors; ++i) {
            into.push_back({Collective::send, block, fqn, phase});
            into.push_back({Collective::recv, block, fqn, phase});
        }
    };
    for (int s = 0; s + 1 < cp; ++s) hop(forward, 2, Phase::forward);
    if (recomputed)
        for (int s = 0; s + 1 < cp; ++s) hop(backward, 2, Phase::backward);
    for (int s = 0; s + 1 < cp; ++s) hop(backward, 4, Phase::backward);
    hop(backward, 2, Phase::backward);
}

}  // namespace

void explain_context_parallel(const Model& model, const Plan& plan, Explanation& ex,
                              const std::function<Shape(const Parameter*, int tp_rank)>& tp_local) {
    const int cp = plan.dims.size(DimRole::cp);
    if (!plan.context_parallel || cp < 2) return;
    const int64_t seq = model.input.shape[1],
                  es = static_cast<int64_t>(dtype_size(plan.compute_dtype(model.dtype)));
    const Resolution& res = ex.resolution;
    // a checkpointed region runs the gathers again
    auto recomputed = [&](const std::string& fqn) { return recomputed_in_backward(res, fqn); };
    // per microbatch: each attention's keys and values [rows, seq, its kv width on tp rank 0]
    std::vector<CommCost> forward, backward;
    const std::vector<CallLayout>& calls = res.layouts.calls;
    for (size_t i = 0; i < calls.size(); ++i) {
        if (!calls[i].module->attention_core()) continue;
        const std::string& fqn = calls[i].fqn;
        const CallLayout* k = nullptr;  // its k_proj's call: the keys' layout on tp
        for (size_t j = i + 1; j < calls.size() && !k; ++j)
            if (calls[j].fqn == fqn + ".k_proj") k = &calls[j];
        if (!k) continue;
        const Shape local = local_shape(k->out.global, k->out.p, res.tp, 0);
        const int64_t bytes = local[0] * seq * local[2] * es;
        if (plan.context_parallel->rotate == RotateMethod::alltoall) {
            ring_comm(fqn, bytes / cp, cp, recomputed(fqn), forward, backward);
            continue;
        }
        forward.push_back({Collective::all_gather, bytes, fqn, Phase::forward});
        forward.push_back({Collective::all_gather, bytes, fqn, Phase::forward});
        if (recomputed(fqn)) {
            backward.push_back({Collective::all_gather, bytes, fqn, Phase::backward});
            backward.push_back({Collective::all_gather, bytes, fqn, Phase::backward});
        }
        backward.push_back({Collective::reduce_scatter, bytes, fqn, Phase::backward});
        backward.push_back({Collective::reduce_scatter, bytes, fqn, Phase::backward});
    }
    const int64_t microbatches = plan.accumulation_rounds(model) * plan.microbatches_per_round();
    for (int64_t m = 0; m < microbatches; ++m) {
        ex.step_comm.insert(ex.step_comm.end(), forward.begin(), forward.end());
        ex.step_comm.insert(ex.step_comm.end(), backward.begin(), backward.end());
    }
    // after backward: the gradients fully_shard did not average over cp, each its own all_reduce
    std::set<std::string> sharded;
    if (plan.dims.cp_shards_params())
        for (const FsdpUnitSpec& u : res.dp.units) sharded.insert(u.params.begin(), u.params.end());
    for (const auto& [name, p] : model.named_parameters()) {
        if (sharded.count(name)) continue;
        const size_t dot = name.rfind('.');
        ex.step_comm.push_back({Collective::all_reduce,
                                bytes_of(tp_local(p.get(), 0), dtype_size(p->value.dtype())),
                                dot == std::string::npos ? "" : name.substr(0, dot), Phase::backward});
    }
}

}  // namespace ptool
