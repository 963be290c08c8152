// Rank-local comparison (RecordOptions::rank_local: in one process every rank compares its own
// piece against its box of the reference's tensor, and the replicas of a tensor their rows of it)
// gives the numbers of gathering every tensor to rank 0 and comparing it whole (what an mpirun
// job does), bitwise: the same maxima, exact sums, replica states and construction digests.
#include <catch2/catch.hpp>

#include "same_runs.h"

using namespace ptool;

namespace test_rank_local {

namespace {

// The ranks in this process, but rank 0 gathers, as under mpirun
class Gathering final : public Launch {
public:
    bool rank0() const override { return true; }
    bool shares_memory() const override { return false; }
    void run(int ranks, const SourceLocation& where, const std::function<void(Communicator&)>& fn,
             std::shared_ptr<CoreSlots> cores) override {
        inner_->run(ranks, where, fn, std::move(cores));
    }
    void wait_for_rank0() override {}
    int exit_code(const std::function<int()>& body) override { return body(); }

private:
    std::unique_ptr<Launch> inner_ = in_process_launch(Device::cpu, CommOptions{});
};

VerifyReport run_verify(const ShippedCase& c, bool rank_local) {
    VerifyJob job = shipped_job(c);
    job.options.reference_beside = false;  // the same reference record for both
    if (rank_local) return verify(job, *in_process_launch(Device::cpu, CommOptions{}));
    Gathering gathering;
    return verify(job, gathering);
}

}  // namespace

TEST_CASE("rank-local comparison gives the numbers of gathering every tensor to rank 0, bitwise", "[cpu]") {
    using Case = ShippedCase;
    // replicas split their rows: DDP (parameters and gradients over dp), an ignored module (its
    // replicas differ: compared whole by dp rank 0), TP's replicated biases over eight ranks, dp x tp
    // with AdamW's shadow optimizer, FSDP + TP, mixed precision's masters, experts owned by one rank
    // of dp_shard each (the others hold none of them) and replicated over dp_replicate
    for (const Case& c : {Case{"replicate_net", "replicate_multi_module", 2, nullptr},
                          Case{"replicate_net", "replicate_ignore_fc1", 2, nullptr},
                          Case{"mlp", "mlp_root_module", 1, "tp=8"},
                          Case{"mlp_stacked_adamw", "mlp_stacked_dp2_tp2", 2, nullptr},
                          Case{"mlp_stacked_adamw", "mlp_stacked_fsdp_tp", 2, nullptr},
                          Case{"llama_rope", "llama_rope_ddp_tp_bf16", 1, nullptr},
                          Case{"moe_qwen2", "moe_qwen2_ep_hsdp", 1, nullptr}}) {
        INFO(c.model << " x " << c.plan);
        const VerifyReport gathered = run_verify(c, false);
        const VerifyReport local = run_verify(c, true);
        CHECK(local.pass == gathered.pass);
        REQUIRE(local.plans.size() == 1);
        REQUIRE(gathered.plans.size() == 1);
        check_same_run(gathered.plans[0].run, local.plans[0].run, static_cast<size_t>(c.steps));
    }
}

}  // namespace test_rank_local
