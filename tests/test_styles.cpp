// The style registry, the styles' static rules through the layout pass (shapes, placements and
// collectives without a tensor), and the lint's layout conflicts.
#include <catch2/catch.hpp>
#include <filesystem>
#include <set>

#include "comm/comm_threads.h"
#include "test_helpers.h"
#include "train/run.h"
#include "train/simulate.h"
#include "verify/verify.h"

using namespace ptool;

namespace test_styles {

namespace {

Model model(const std::string& name) {
    return load_model_text(read_text(PTOOL_SOURCE_DIR "/models/" + name + ".yaml"), name + ".yaml", "",
                           false);
}

Plan plan_text(const std::string& text) {
    return load_plan_text(text, "plan.yaml");
}

const CallLayout& call(const LayoutReport& r, const std::string& fqn) {
    for (const CallLayout& c : r.calls)
        if (c.fqn == fqn) return c;
    FAIL("no call of '" << fqn << "'");
    return r.calls.front();
}

// "models/x.yaml": the model a shipped plan's header names ("model: models/x.yaml", "(model: ...)").
std::string plan_model_path(const Plan& p) {
    const size_t at = p.yaml_text.find("models/");
    return p.yaml_text.substr(at, p.yaml_text.find(".yaml", at) + 5 - at);
}

std::map<std::string, std::pair<int, int64_t>> totals(const std::vector<CommCost>& costs) {
    std::map<std::string, std::pair<int, int64_t>> t;
    for (const CommCost& c : costs)
        t[collective_name(c.op)].first += 1, t[collective_name(c.op)].second += c.bytes;
    return t;
}

}  // namespace

TEST_CASE("the registry holds every style by name, once", "[cpu]") {
    const std::vector<std::string> names = style_names();
    for (const char* name : {"colwise", "rowwise", "sequence_parallel", "prepare_input", "prepare_output",
                             "prepare_input_output"}) {
        INFO(name);
        REQUIRE(find_style(name));
        CHECK(find_style(name)->name() == name);
        CHECK(std::count(names.begin(), names.end(), name) == 1);
    }
    CHECK(find_style("colwize") == nullptr);
}

TEST_CASE("the layout pass follows a Megatron block's placements and costs its collectives", "[cpu]") {
    const Model m = model("gpt_block");
    const Plan p = load_plan(PTOOL_SOURCE_DIR "/plans/gpt_block_tp.yaml");
    const Resolution res = resolve_plan(m, p);
    const LayoutReport& r = res.layouts;
    // q/k/v colwise: Replicate in, heads sharded out; o_proj rowwise gathers nothing and reduces once
    CHECK(call(r, "attn_block.attn.q_proj").in.p.is_replicate());
    CHECK(call(r, "attn_block.attn.q_proj").out.p.same_as(Placement::shard(-1), 3));
    CHECK(call(r, "attn_block.attn.q_proj").out.global == Shape{4, 16, 32});
    CHECK(call(r, "attn_block.attn.o_proj").in.p.same_as(Placement::shard(2), 3));
    CHECK(call(r, "attn_block.attn.o_proj").out.p.is_replicate());
    CHECK(r.output.global == Shape{4, 16, 64});
    // forward: o_proj's and c_proj's all_reduce of [4, 16, 32] fp32; backward: the three
    // projections' and c_fc's input gradients, Partial -> all_reduce
    const auto fwd = totals(r.forward), bwd = totals(r.backward);
    CHECK(fwd.at("all_reduce") == std::pair<int, int64_t>{2, 2 * 4 * 16 * 32 * 4});
    CHECK(bwd.at("all_reduce") == std::pair<int, int64_t>{4, 4 * 4 * 16 * 32 * 4});
    CHECK(fwd.size() == 1);
    CHECK(bwd.size() == 1);
}

TEST_CASE("sequence parallel: norms on sequence shards, gathered into the MLP and scattered out", "[cpu]") {
    const Model m = model("seq_mlp");
    const Resolution res = resolve_plan(m, load_plan(PTOOL_SOURCE_DIR "/plans/seq_mlp_sp.yaml"));
    const LayoutReport& r = res.layouts;
    CHECK(r.input.p.same_as(Placement::shard(1), 3));
    CHECK(call(r, "norm1").out.p.same_as(Placement::shard(1), 3));
    CHECK(call(r, "net1").out.p.same_as(Placement::shard(-1), 3));
    CHECK(call(r, "net2").out.p.same_as(Placement::shard(1), 3));
    CHECK(r.output.p.same_as(Placement::shard(1), 3));
    const auto fwd = totals(r.forward), bwd = totals(r.backward);
    CHECK(fwd.at("all_gather").first == 2);      // net1's input, and the output for the loss
    CHECK(fwd.at("reduce_scatter").first == 1);  // net2's output
    CHECK(bwd.at("all_reduce").first == 4);  // the norms' 3 parameter gradients, net2's bias over its rows
    CHECK(bwd.at("reduce_scatter").first == 1);  // net1's input gradient back to sequence shards
}

TEST_CASE("layout conflicts are exit-2 errors at the plan entry, with the fix", "[cpu]") {
    const Model m = model("seq_mlp");
    // torchtitan's slip: a sequence-parallel norm feeding a colwise linear that declares Replicate
    require_input_error(
        [&] {
            resolve_plan(m,
                         plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                   "    norm1: sequence_parallel\n    net1: colwise\n    net2: rowwise\n"));
        },
        {"plan.yaml:6:5:", "'net1' (colwise) takes its input as Replicate() but 'norm1' outputs Shard(1)",
         "add prepare_input shard(1) -> replicate on 'net1'", "input_layouts: shard(1) on 'net1'"});
    // a colwise output fed to a plain norm
    require_input_error(
        [&] {
            resolve_plan(m, plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                      "    net2: colwise\n"));
        },
        {"plan.yaml:5:5:", "'net2' outputs Shard(-1) but 'norm2' (rms_norm) needs whole rows",
         "seq_mlp.yaml:"});
    // a sequence-sharded activation into attention
    const Model llama = model("llama_block");
    require_input_error(
        [&] {
            resolve_plan(llama, plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                          "    attn_block.input_layernorm: sequence_parallel\n"
                                          "    'attn_block.self_attn.[qkv]_proj': {style: colwise, "
                                          "input_layouts: shard(1), output_layouts: shard(1)}\n"));
        },
        {"attention 'attn_block.self_attn' needs the whole sequence"});
}

TEST_CASE("a plan's lint leaves a correct plan alone and each styled call's layouts are its rule's",
          "[cpu]") {
    for (const char* name :
         {"gpt_block_tp", "llama_block_tp", "seq_mlp_sp", "mlp_stacked_fsdp_tp", "embedding_rowwise"}) {
        INFO(name);
        const Plan p = load_plan(std::string(PTOOL_SOURCE_DIR "/plans/") + name + ".yaml");
        const Model m = load_model_text(read_text(std::string(PTOOL_SOURCE_DIR "/") + plan_model_path(p)),
                                        plan_model_path(p), "", false);
        const Resolution res = resolve_plan(m, p);
        CHECK(res.layouts.calls.size() >= 3);
        for (const ResolvedStyle& rs : res.styles) {
            const StyleRule rule = rs.entry->style.style->rule(*rs.module, rs.entry->style);
            if (rule.pre)
                CHECK(call(res.layouts, rs.fqn)
                          .in.p.same_as(rule.pre->from,
                                        static_cast<int64_t>(call(res.layouts, rs.fqn).in.global.size())));
            if (rule.post)
                CHECK(call(res.layouts, rs.fqn)
                          .out.p.same_as(rule.post->to,
                                         static_cast<int64_t>(call(res.layouts, rs.fqn).out.global.size())));
        }
    }
}

namespace {

// What one module call looked like at run time, from outside its hooks (as its caller sees it).
struct SeenCall {
    std::string fqn;
    Layout in, out, grad_out, grad_in;  // grad_in: unset (empty shape) when it has no input gradient
    bool backward = false;
    std::string local_error;  // a local tensor whose shape is not its rank's piece of the layout
};

// Hooks outside every module's own (and its style's) that log each call's layouts and check each
// local tensor against the piece its layout says this rank holds. A rank thread's own log.
class Probe final : public ModuleHooks {
public:
    explicit Probe(std::vector<SeenCall>& log) : log_(log) {}
    Placed pre_forward(RunContext& ctx, Module& m, const Placed& x) override {
        if (ctx.recomputing) return x;  // a checkpointed module's recompute: not a call of the step
        open_.push_back(log_.size());
        log_.push_back({m.fqn(), x.layout(), {}, {}, {}, false, {}});
        check_local(ctx, x, "input");
        return x;
    }
    Placed post_forward(RunContext& ctx, Module&, const Placed& y) override {
        if (ctx.recomputing) return y;
        log_[open_.back()].out = y.layout();
        check_local(ctx, y, "output");
        forwards_.push_back(open_.back());
        open_.pop_back();
        return y;
    }
    Placed post_forward_backward(RunContext& ctx, Module&, const Placed& dy) override {
        current_ = forwards_.back();  // a module's calls are undone last-in first-out, as its saves
        forwards_.pop_back();
        log_[current_].grad_out = dy.layout(), log_[current_].backward = true;
        check_local(ctx, dy, "output gradient");
        return dy;
    }
    Placed pre_forward_backward(RunContext& ctx, Module&, const Placed& dx) override {
        log_[current_].grad_in = dx.layout();
        check_local(ctx, dx, "input gradient");
        return dx;
    }

private:
    void check_local(const RunContext& ctx, const Placed& x, const char* what) {
        const Shape want = local_shape(x.global, x.p, ctx.tp_parts, ctx.tp_rank);
        if (x.t.shape() != want && log_[current_or_open()].local_error.empty())
            log_[current_or_open()].local_error =
                fmt::format("tp rank {}: {} {} holds {}, its piece is {}", ctx.tp_rank, what,
                            x.layout().str(), shape_str(x.t.shape()), shape_str(want));
    }
    size_t current_or_open() const { return open_.empty() ? current_ : open_.back(); }
    std::vector<SeenCall>& log_;
    std::vector<size_t> open_, forwards_;
    size_t current_ = 0;
};

// Installs a Probe on every module after parallelize (outside the styles' hooks).
class ProbeLayer final : public RunLayer {
public:
    explicit ProbeLayer(std::vector<SeenCall>& log) : log_(log) {}
    void after_parallelize(Model& model, const Plan&, const Resolution&, const TpParams&,
                           DeviceMesh&) override {
        std::set<const Module*> seen;  // a shared module is one object under two names: one probe
        for_each_module(*model.root, [&](const std::string&, Module& m) {
            if (seen.insert(&m).second) m.add_outer_hooks(std::make_shared<Probe>(log_));
        });
    }

private:
    std::vector<SeenCall>& log_;
};

}  // namespace

namespace {

// A call inside a mixture of experts' expert (its rows depend on the routing).
bool routed_rows(const std::string& fqn) {
    return fqn.find(".experts.") != std::string::npos;
}

}  // namespace

TEST_CASE("the runtime follows the layout pass: every call's layouts, gradients and local pieces", "[cpu]") {
    // One training step of every shipped plan on rank threads, watched from outside each module's
    // hooks: the layout each call receives and returns is the one the layout pass derived (the lint
    // and explain read that pass, the run reads the styles' hooks), each gradient is placed as the
    // gradient of its activation's layout (colwise's input gradient reduce_scattered back to
    // Shard(1) under sequence parallelism, all_reduced to Replicate otherwise), and every rank's
    // local tensor is the piece of the full shape its placement says it holds.
    int plans = 0;
    for (const auto& entry : std::filesystem::directory_iterator(PTOOL_SOURCE_DIR "/plans")) {
        const std::string name = entry.path().stem().string();
        if (entry.path().extension() != ".yaml" || name.rfind("gemm_mlp", 0) == 0)
            continue;  // benchmark-sized
        INFO(name);
        const Plan plan = load_plan(entry.path().string());
        RunInputs in;
        in.model_path = std::string(PTOOL_SOURCE_DIR "/") + plan_model_path(plan);
        in.model_text = read_text(in.model_path);
        const int world = plan.world_size();
        std::vector<std::vector<SeenCall>> seen(static_cast<size_t>(world));
        std::vector<std::vector<CallLayout>> derived(static_cast<size_t>(world));
        std::vector<int64_t> microbatches(static_cast<size_t>(world));
        run_rank_threads(world, CommOptions{},
                         [&](Communicator& w) {  // Catch2 is not thread-safe: checked after the join
                             const size_t r = static_cast<size_t>(w.rank());
                             ProbeLayer probe(seen[r]);
                             Run run(in, plan, w, &probe);
                             run.step(0);
                             // (an unnamed residual has no probe of its own: for_each_module
                             // passes over it, as over every transparent container)
                             // under expert parallelism a rank calls its own experts only
                             const ExpertParallelResolution& ep = run.resolution().ep;
                             auto owned = [&](const std::string& fqn) {
                                 if (!ep.active || !routed_rows(fqn)) return true;
                                 auto it = ep.owner.lower_bound(fqn + ".");
                                 return it == ep.owner.end() || it->first.rfind(fqn + ".", 0) != 0 ||
                                        it->second == run.comm(DimRole::ep).rank();
                             };
                             for (const CallLayout& c : run.resolution().layouts.calls)
                                 if (!c.module->transparent() && owned(c.fqn)) derived[r].push_back(c);
                             microbatches[r] = run.plan().accumulation_rounds(run.model());
                         });
        for (size_t r = 0; r < seen.size(); ++r) {
            INFO("rank " << r);
            const std::vector<CallLayout>& calls = derived[r];
            REQUIRE(seen[r].size() ==
                    calls.size() * static_cast<size_t>(microbatches[r]));  // every call, per microbatch
            for (size_t i = 0; i < seen[r].size(); ++i) {
                const SeenCall& s = seen[r][i];
                const CallLayout& c = calls[i % calls.size()];
                INFO("call " << i << " '" << s.fqn << "': in " << s.in.str() << " (derived " << c.in.str()
                             << "), out " << s.out.str() << " (derived " << c.out.str() << ")");
                CHECK(s.fqn == c.fqn);
                // an expert's rows are the tokens routed to it (data-dependent): the layout pass
                // derives the balanced routing's count, the run routes its batch (model/moe.h)
                if (routed_rows(s.fqn)) {
                    CHECK(s.in.p.same_as(c.in.p, 3));
                    CHECK(s.out.p.same_as(c.out.p, 3));
                    CHECK(s.in.global.back() == c.in.global.back());
                    CHECK(s.out.global.back() == c.out.global.back());
                    CHECK(s.local_error == "");
                    REQUIRE(s.backward);
                    continue;
                }
                CHECK(s.in.same_as(c.in));
                CHECK(s.out.same_as(c.out));
                CHECK(s.local_error == "");
                REQUIRE(s.backward);
                INFO("output gradient " << s.grad_out.str() << ", input gradient " << s.grad_in.str());
                CHECK(s.grad_out.same_as(Layout{c.out.global, grad_placement(c.out.p)}));
                if (!s.grad_in.global.empty())
                    CHECK(s.grad_in.same_as(Layout{c.in.global, grad_placement(c.in.p)}));
                if (name == "seq_mlp_sp" &&
                    s.fqn == "net1")  // colwise, input_layouts shard(1): the gradient goes back as Shard(1)
                    CHECK(s.grad_in.p.same_as(Placement::shard(1), 3));
            }
        }
        ++plans;
    }
    CHECK(plans >= 35);
}

namespace {

// verify of a shipped model under a plan given as text, in this process.
VerifyReport verify_text(const std::string& model_name, const std::string& plan) {
    VerifyJob job;
    job.inputs.model_path = PTOOL_SOURCE_DIR "/models/" + model_name + ".yaml";
    job.inputs.model_text = read_text(job.inputs.model_path);
    job.plans = {plan_text(plan)};
    const auto launch = in_process_launch(Device::cpu, CommOptions{});
    return verify(job, *launch);
}

}  // namespace

TEST_CASE("replicate: a module run whole on every rank, its input checked to be whole", "[cpu]") {
    // the example of docs/adding_a_style.md: gpt_block's final norm and its MLP norm declared replicated
    const std::string plan =
        "mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  src_data_rank: 0\n  plan:\n"
        "    'attn_block.attn.[qkv]_proj': colwise\n    attn_block.attn.o_proj: rowwise\n"
        "    mlp_block.ln_2: replicate\n    ln_f: replicate\n";
    const Resolution res = resolve_plan(model("gpt_block"), plan_text(plan));
    CHECK(call(res.layouts, "ln_f").in.p.is_replicate());
    const VerifyReport r = verify_text("gpt_block", plan);
    REQUIRE(r.plans.size() == 1);
    CHECK(r.pass);
    CHECK(r.plans[0].failed == 0);
    CHECK(r.plans[0].run.init_counts.by_op().at(Collective::broadcast).calls >=
          2);  // its parameters come from src_data_rank
    // where the input is not whole, the claim is an error
    require_input_error(
        [&] {
            resolve_plan(model("mlp"), plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                                                 "    net1: colwise\n    relu: replicate\n"));
        },
        {"'relu' (replicate) takes its input as Replicate() but 'net1' outputs Shard(-1)"});
}

TEST_CASE("save_input shard: Megatron's colwise keeps the input's sequence shard and gathers it in backward",
          "[cpu]") {
    // plans/llama_rope_tp_sp_megatron.yaml against the same plan keeping the gathered inputs
    // (DTensor's): the same numbers bit for bit, an all_gather more per projection call in backward
    // with the forward's bytes, in the layout pass and in the run, and less memory held.
    const std::string path = PTOOL_SOURCE_DIR "/plans/llama_rope_tp_sp_megatron.yaml";
    const std::string megatron = read_text(path);
    std::string gathered = megatron;
    for (size_t at; (at = gathered.find(", save_input: shard")) != std::string::npos;) gathered.erase(at, 19);
    REQUIRE(gathered.find(", save_input") == std::string::npos);
    const Plan shard_plan = load_plan_text(megatron, path), gathered_plan = plan_text(gathered);
    const Model m = model("llama_rope");
    const LayoutReport rs = resolve_plan(m, shard_plan).layouts, rg = resolve_plan(m, gathered_plan).layouts;
    const auto fwd = totals(rs.forward), bwd_s = totals(rs.backward), bwd_g = totals(rg.backward);
    CHECK(totals(rg.forward) == fwd);
    CHECK(fwd.at("all_gather").first == 11);  // q, k, v, gate, up in 2 layers, and the head
    const std::pair<int, int64_t> none{0, 0};
    const auto gathered_bwd = bwd_g.count("all_gather") ? bwd_g.at("all_gather") : none;
    CHECK(bwd_s.at("all_gather").first == gathered_bwd.first + 11);
    CHECK(bwd_s.at("all_gather").second == gathered_bwd.second + fwd.at("all_gather").second);
    CHECK(bwd_s.at("reduce_scatter") == bwd_g.at("reduce_scatter"));

    // the run: every rank's parameters after two steps bit for bit, the collectives as derived
    RunInputs in;
    in.model_path = PTOOL_SOURCE_DIR "/models/llama_rope.yaml";
    in.model_text = read_text(in.model_path);
    struct Seen {
        std::vector<Tensor> params;
        int64_t all_gathers = 0, microbatches = 0;
    };
    auto run_plan = [&](const Plan& plan) {
        std::vector<Seen> seen(2);
        run_rank_threads(2, CommOptions{}, [&](Communicator& w) {
            Seen& s = seen[static_cast<size_t>(w.rank())];
            Run run(in, plan, w);
            run.step(0);
            run.counter().reset();
            run.step(1);
            for_each_param(*run.model().root, [&](const std::string&, const ParamPtr& p) {
                s.params.push_back(p->value.clone());
            });
            s.all_gathers = run.counter().by_op()[Collective::all_gather].calls;
            s.microbatches = run.plan().accumulation_rounds(run.model());
        });
        return seen;
    };
    const std::vector<Seen> a = run_plan(shard_plan), b = run_plan(gathered_plan);
    for (size_t r = 0; r < 2; ++r) {
        INFO("rank " << r);
        REQUIRE(a[r].params.size() == b[r].params.size());
        for (size_t i = 0; i < a[r].params.size(); ++i) CHECK(same_bits(a[r].params[i], b[r].params[i]));
        CHECK(a[r].microbatches == 2);
        CHECK(a[r].all_gathers == b[r].all_gathers + 11 * a[r].microbatches);
    }

    // memory: the shard kept instead of the gathered input (rank 0, three simulated steps)
    const RankSimulation ms = simulate_rank(in, shard_plan, 0, 3),
                         mg = simulate_rank(in, gathered_plan, 0, 3);
    CHECK(ms.memory.peak < mg.memory.peak);
    // and by no more than every projection's gathered input (2 rows x 8 positions x 32 features,
    // fp32; the shard kept is one tensor for q, k and v, and one for gate and up)
    CHECK(mg.memory.peak - ms.memory.peak <= 11 * (2 * 8 * 32 * 4));

    // verify: the plan passes against the single-device reference
    const VerifyReport v = verify_text("llama_rope", megatron);
    REQUIRE(v.plans.size() == 1);
    CHECK(v.pass);
}

TEST_CASE("save_input: its values, and only where an input is gathered, else exit 2 at the entry", "[cpu]") {
    const Model m = model("llama_rope");
    auto plan = [](const std::string& entry) {
        return plan_text("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    " + entry + "\n");
    };
    require_input_error(
        [&] { plan("output: {style: colwise, input_layouts: shard(1), save_input: shards}"); },
        {"plan.yaml:5:", "'save_input: shards' is not one of gathered", "shard (Megatron"});
    require_input_error([&] { plan("output: {style: colwise, save_input: shard}"); },
                        {"plan.yaml:5:", "needs an input that is gathered", "input_layouts: shard(d)"});
    require_input_error([&] { plan("output: {style: colwise, input_layouts: partial, save_input: shard}"); },
                        {"needs an input that is gathered"});
    require_input_error([&] { plan("output: {style: rowwise, save_input: shard}"); }, {"save_input"});
    require_input_error(
        [&] {
            resolve_plan(
                m, plan("tok_embeddings: {style: colwise, input_layouts: shard(1), save_input: shard}"));
        },
        {"plan.yaml:5:", "save_input: shard applies to linear modules", "tok_embeddings (embedding)"});
    // `gathered` is the default spelled out: the same layouts and collectives
    const LayoutReport plain = resolve_plan(m, plan("output: {style: colwise}")).layouts;
    const LayoutReport spelled =
        resolve_plan(m, plan("output: {style: colwise, save_input: gathered}")).layouts;
    CHECK(totals(plain.backward) == totals(spelled.backward));
}

}  // namespace test_styles
