// libFuzzer harness, structure-aware: the input's bytes choose a *valid* model (a random module
// tree: embeddings, GPT-2 position embeddings, linears, activations, norms, dropout, attention with GQA
// (Qwen3's head_dim and q/k norms, OLMo2's whole-projection ones), gated MLPs, mixtures of experts (routers,
// shared experts, the balancing loss, expert capacities), residuals named or transparent; random sizes,
// losses and optimizers) and a plan for it (a mesh with tp and dp dims, styles on random modules with random
// layouts, src_data_rank, replicate or fully_shard, expert parallel over dp; a router gate styled like any
// linear; issue 50's newer sections: a pipeline over 2 pp ranks (every schedule, split points at the
// top-level blocks), context parallel over 2 cp ranks, a `shared` use of an earlier block that may land
// on another pp rank's stage), as YAML text, then runs `ptool explain` and a one-step `ptool verify` on
// them in this process. The only outcomes allowed are those of exit
// 0, 1 and 2: a result (pass or mismatch) or an InputError. A RuntimeError (a rank failed), an internal
// error, a signal or a sanitizer report is a finding.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "plan/explain.h"
#include "verify/verify.h"

namespace {

struct Gen {
    FuzzedDataProvider& in;
    std::vector<std::string> linears, norms, modules;  // FQNs, for the plan
    std::vector<std::string> tops;  // top-level blocks, in order: a pipeline's split points
    int64_t width = 8;
    bool experts = false;  // a moe layer (expert_parallel may split it)
    // Well-formed (half the inputs): sizes that divide over every mesh dim, the batch over dp x the
    // microbatches, the sequence over cp's chunks, and no tensor-parallel styles, so that pipelines,
    // context and expert parallel get past the lint into a verify (random styles and sizes send
    // most of the others to a layout or divisibility refusal first: PTOOL_FUZZ_STATS counts both).
    bool well_formed = false;

    int64_t pick(std::initializer_list<const int64_t> v) { return in.PickValueInArray(v); }

    std::string linear(const std::string& prefix, const std::string& name, int64_t in_f, int64_t out_f) {
        linears.push_back(prefix + name);
        modules.push_back(prefix + name);
        return fmt::format("{{name: {}, type: linear, in: {}, out: {}, bias: {}}}", name, in_f, out_f,
                           in.ConsumeBool() ? "true" : "false");
    }

    // One block of the body, keeping the width (so residuals and the head fit).
    std::string block(const std::string& prefix, const std::string& name, int depth) {
        const int64_t hidden = well_formed ? pick({4, 8, 16}) : pick({2, 4, 6, 8, 12, 16});
        switch (in.ConsumeIntegralInRange(0, depth > 1 ? 5 : 8)) {
            case 0:
                return "  - " + linear(prefix, name, width, width) + "\n";
            case 1:
                return fmt::format("  - {{name: {}, type: {}}}\n", name,
                                   in.PickValueInArray({"relu", "gelu", "silu", "tanh", "identity"}));
            case 2: {
                norms.push_back(prefix + name), modules.push_back(prefix + name);
                return fmt::format("  - {{name: {}, type: {}, dim: {}}}\n", name,
                                   in.ConsumeBool() ? "layer_norm" : "rms_norm", width);
            }
            case 3:
                return fmt::format("  - {{name: {}, type: dropout, p: {}}}\n", name,
                                   in.ConsumeBool() ? 0.0 : 0.25);
            case 4: {  // an MLP pair
                std::string s = "  - " + linear(prefix, name + "u", width, hidden) + "\n";
                return s + "  - " + linear(prefix, name + "d", hidden, width) + "\n";
            }
            case 5: {
                modules.push_back(prefix + name);
                for (const char* p : {"gate_proj", "up_proj", "down_proj"})
                    linears.push_back(prefix + name + "." + p);
                return fmt::format("  - {{name: {}, type: gated_mlp, dim: {}, hidden: {}}}\n", name, width,
                                   hidden);
            }
            case 6: {  // attention needs [batch, seq, dim]
                const int64_t heads = width % 4 == 0 && in.ConsumeBool() ? 4 : 2,
                              kv = in.ConsumeBool() ? heads : heads / 2;
                modules.push_back(prefix + name);
                for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
                    linears.push_back(prefix + name + "." + p);
                // Qwen3's: heads wider than dim / heads, per-head q/k norms
                const std::string qwen3 = in.ConsumeBool()
                                              ? fmt::format(", head_dim: {}, qk_norm: {}", pick({2, 4, 6}),
                                                            in.ConsumeBool() ? "true" : "false")
                                              : "";
                return fmt::format(
                    "  - {{name: {}, type: attention, dim: {}, heads: {}, kv_heads: {}, causal: {}, bias: "
                    "{}, attn_implementation: {}{}}}\n",
                    name, width, heads, kv, in.ConsumeBool() ? "true" : "false",
                    in.ConsumeBool() ? "true" : "false", in.ConsumeBool() ? "flash" : "eager", qwen3);
            }
            case 8: {  // a mixture of experts (whole tokens): Mixtral's, Qwen2-MoE's, DeepSeek-V3's routers
                const int64_t e = pick({2, 4}), k = in.ConsumeIntegralInRange<int64_t>(1, e);
                const bool sigmoid = in.ConsumeBool(), shared = in.ConsumeBool();
                modules.push_back(prefix + name), experts = true;
                linears.push_back(prefix + name + ".gate");  // the router: must end Replicate under tp
                for (const char* p : {"gate_proj", "up_proj", "down_proj"})
                    linears.push_back(prefix + name + ".experts.*." + p);
                return fmt::format(
                    "  - {{name: {}, type: moe, dim: {}, hidden: {}, experts: {}, top_k: {}, score_func: {}, "
                    "norm_topk_prob: {}, selection_bias: {}{}{}}}\n",
                    name, width, hidden, e, k, sigmoid ? "sigmoid" : "softmax",
                    in.ConsumeBool() ? "true" : "false", sigmoid && in.ConsumeBool() ? "true" : "false",
                    shared ? fmt::format(", shared_hidden: {}, shared_gate: {}", hidden,
                                         in.ConsumeBool() ? "true" : "false")
                           : "",
                    std::string(!sigmoid && in.ConsumeBool() ? ", aux_loss_coef: 0.01" : "") +
                        (in.ConsumeBool()
                             ? fmt::format(", capacity_factor: {}", in.PickValueInArray({0.5, 1.0, 1.25}))
                             : ""));
            }
            default: {
                // named, or transparent (no name: its modules keep this prefix, as HF's decoder layers)
                const bool transparent = in.ConsumeBool();
                if (!transparent) modules.push_back(prefix + name);
                std::string s = transparent
                                    ? std::string("  - type: residual\n    modules:\n")
                                    : fmt::format("  - name: {}\n    type: residual\n    modules:\n", name);
                const int n = in.ConsumeIntegralInRange(1, 3);
                for (int k = 0; k < n; ++k) {
                    std::string b = transparent
                                        ? block(prefix, fmt::format("{}_{}", name, k), depth + 1)
                                        : block(prefix + name + ".", fmt::format("b{}", k), depth + 1);
                    for (size_t at = 0; (at = b.find('\n', at)) != std::string::npos && at + 1 < b.size();
                         ++at)
                        b.insert(at + 1, "    ");
                    s += "    " + b;
                }
                return s;
            }
        }
    }

    std::string model(bool& three_d) {
        well_formed = in.ConsumeBool();
        width = pick({4, 8, 12, 16});
        const int64_t batch = well_formed ? 4 : pick({1, 2, 4}), seq = well_formed ? 4 : pick({1, 2, 4, 6});
        const bool tokens = in.ConsumeBool();
        three_d = tokens || in.ConsumeBool();
        std::string s = fmt::format("seed: {}\nsteps: 1\ndtype: {}\n", in.ConsumeIntegral<uint8_t>(),
                                    in.ConsumeBool() ? "float32" : "float64");
        const int64_t vocab = well_formed ? 16 : pick({8, 16, 33});
        if (tokens)
            s += fmt::format("batch:\n  input: {{tokens: [{}, {}], vocab: {}}}\n", batch, seq, vocab);
        else
            s += three_d ? fmt::format("batch:\n  input: [{}, {}, {}]\n", batch, seq, width)
                         : fmt::format("batch:\n  input: [{}, {}]\n", batch, width);
        s += "modules:\n";
        if (tokens)
            s += fmt::format("  - {{name: wte, type: embedding, vocab: {}, dim: {}}}\n", vocab, width),
                modules.push_back("wte");
        if (tokens && in.ConsumeBool())  // GPT-2's learned positions
            s += fmt::format("  - {{name: wpe, type: position_embedding, positions: {}, dim: {}}}\n",
                             seq + pick({0, 3}), width),
                modules.push_back("wpe");
        const int blocks = in.ConsumeIntegralInRange(1, 5);
        for (int i = 0; i < blocks; ++i) {
            std::string b =
                block("", fmt::format("b{}", i), three_d ? 0 : 1);  // attention only on [batch, seq, dim]
            if (!three_d && b.find("attention") != std::string::npos) continue;
            s += b;
        }
        // a `shared` use of an earlier top-level block (each keeps the width): under a pipeline its
        // two uses may land on two pp ranks' stages (refused) or one's
        std::vector<std::string> earlier;
        for (const std::string& m : modules)
            if (m.size() > 1 && m[0] == 'b' && m.find_first_not_of("0123456789", 1) == std::string::npos)
                earlier.push_back(m);
        if (!earlier.empty() && in.ConsumeBool())
            s += fmt::format("  - {{name: again, type: shared, module: {}}}\n",
                             earlier[in.ConsumeIntegralInRange<size_t>(0, earlier.size() - 1)]);
        tops = earlier;
        tops.push_back("head");
        const int64_t classes = pick({4, 8, 16});
        s += "  - " + linear("", "head", width, classes) + "\n";
        const char* loss = in.PickValueInArray({"sum", "mean", "mse", "cross_entropy"});
        s += fmt::format("loss: {}\n", loss);
        s += in.ConsumeBool() ? "optimizer: {type: sgd, lr: 0.05, momentum: 0.9}\n"
                              : "optimizer: {type: adamw, lr: 0.001, eps: 1e-6}\n";
        return s;
    }

    std::string layout() {
        return in.PickValueInArray({"replicate", "shard(0)", "shard(1)", "shard(-1)", "partial"});
    }

    std::string plan(bool three_d) {
        const bool pp = tops.size() >= 2 && in.ConsumeBool(), cp = three_d && in.ConsumeBool();
        const int tp = well_formed ? 1 : static_cast<int>(in.ConsumeIntegralInRange(1, pp || cp ? 2 : 4)),
                  dp = in.ConsumeBool() ? 2 : 1;
        const bool hsdp =
            dp > 1 && experts && !pp && !cp && in.ConsumeBool();  // HSDP 2 x 2, ep over either dim
        std::string s = "mesh: {";
        if (hsdp) s += "rep: 2, ";
        if (dp > 1) s += "dp: 2, ";
        if (pp) s += "pp: 2, ";
        if (cp) s += "cp: 2, ";
        s += fmt::format("tp: {}}}\n", tp);
        // well-formed: a pipeline's microbatches divide the rows each dp rank gets, and reach the pp ranks
        const int64_t microbatches = well_formed ? (dp > 1 ? 2 : 4) : pick({1, 2, 4});
        if (pp) {  // torch.distributed.pipelining's schedules; split points at top-level blocks
            // well-formed: interleaved's 4 stages only where there are 4 blocks to split at, with a
            // microbatch per stage
            const std::string schedule = well_formed && (tops.size() < 4 || dp > 1)
                                             ? in.PickValueInArray({"gpipe", "1f1b"})
                                             : in.PickValueInArray({"gpipe", "1f1b", "interleaved_1f1b"});
            const int stages = schedule == "interleaved_1f1b" ? 4 : 2;  // virtual_stages 2
            s += fmt::format("pipeline_parallel:\n  mesh_dim: pp\n  microbatches: {}\n  schedule: {}\n",
                             microbatches, schedule);
            std::vector<std::string> points;
            for (size_t i = 1; i < tops.size() && static_cast<int>(points.size()) < stages - 1; ++i)
                if (in.ConsumeBool() || tops.size() - i <= static_cast<size_t>(stages - 1) - points.size())
                    points.push_back(tops[i]);
            s += fmt::format("  split_points: [{}]\n", fmt::join(points, ", "));
        }
        if (cp)
            s +=
                fmt::format("context_parallel: {{mesh_dim: cp, rotate_method: {}, load_balance: {}}}\n",
                            in.ConsumeBool() ? "allgather" : "alltoall", in.ConsumeBool() ? "true" : "false");
        if (!well_formed)
            s += fmt::format("tensor_parallel:\n  mesh_dim: tp\n  src_data_rank: {}\n  plan:\n",
                             in.ConsumeBool() ? "0" : "null");
        const bool megatron =
            in.ConsumeBool();  // colwise then rowwise, in order: the usual shape of a correct plan
        for (size_t i = 0; !well_formed && i < linears.size() && in.remaining_bytes() > 0; ++i) {
            const int choice = in.ConsumeIntegralInRange(0, 3);
            if (choice == 0) continue;
            const char* style =
                megatron ? (i % 2 ? "rowwise" : "colwise") : in.PickValueInArray({"colwise", "rowwise"});
            if (choice == 3)
                s += fmt::format("    \"{}\": {{style: {}, input_layouts: {}, output_layouts: {}}}\n",
                                 linears[i], style, layout(), layout());
            else
                s += fmt::format("    \"{}\": {}\n", linears[i], style);
        }
        for (const std::string& n : norms)
            if (!well_formed && in.ConsumeBool()) s += fmt::format("    \"{}\": sequence_parallel\n", n);
        if (!well_formed && !modules.empty() && in.ConsumeBool())
            s += fmt::format(
                "    \"{}\": {{style: prepare_input_output, input_layouts: {}, desired_input_layouts: {}, "
                "output_layouts: {}, desired_output_layouts: {}}}\n",
                modules[in.ConsumeIntegralInRange<size_t>(0, modules.size() - 1)], layout(), layout(),
                layout(), layout());
        if (hsdp)
            s += "data_parallel: {mesh_dim: [rep, dp], mode: fully_shard}\n";
        else if (dp > 1)
            s += fmt::format("data_parallel: {{mesh_dim: dp, mode: {}}}\n",
                             in.ConsumeBool() ? "replicate" : "fully_shard");
        if (dp > 1 && experts && in.ConsumeBool())  // under HSDP over rep: the experts sharded over dp
            s += fmt::format("expert_parallel: {{mesh_dim: {}}}\n", hsdp && in.ConsumeBool() ? "rep" : "dp");
        if (!modules.empty() && in.ConsumeBool())  // full, torchtitan's op policy or Megatron's core_attn
            s += fmt::format("activation_checkpointing: {{modules: [\"{}\"], mode: {}, every: {}}}\n",
                             modules[in.ConsumeIntegralInRange<size_t>(0, modules.size() - 1)],
                             in.PickValueInArray({"full", "op", "core_attn"}),
                             in.ConsumeIntegralInRange(1, 3));
        if (!well_formed && in.ConsumeBool())
            s += fmt::format("gradient_accumulation: {}\n", pick({1, 2, 4}));
        return s;
    }
};

}  // namespace

namespace {
int64_t g_runs = 0, g_refused = 0,
        g_passed = 0;  // how far the generated cases get (PTOOL_FUZZ_STATS=1 prints it)

// The newer sections (issue 50): how many generated cases hold each, and how many of those got past
// the lint into a verify, so a run shows the sections were reached, not only generated.
struct Section {
    const char* name;
    const char* key;  // a substring of the model or plan text that marks it
    int64_t generated = 0, verified = 0;
};
Section g_sections[] = {{"pipeline", "pipeline_parallel:"},
                        {"context_parallel", "context_parallel:"},
                        {"expert_parallel", "expert_parallel:"},
                        {"moe", "type: moe"},
                        {"shared", "type: shared"},
                        {"fully_shard", "fully_shard"}};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const bool quiet = [] {
        ptool::set_model_byte_limit(1 << 20);
        if (std::getenv("PTOOL_FUZZ_STATS"))
            std::atexit([] {
                std::fprintf(
                    stderr,
                    "fuzz_model_plan: %lld cases: %lld refused by the lint, %lld verified, %lld passed\n",
                    (long long)g_runs, (long long)g_refused, (long long)(g_runs - g_refused),
                    (long long)g_passed);
                for (const Section& c : g_sections)
                    std::fprintf(stderr, "fuzz_model_plan: %s in %lld cases, %lld of them verified\n", c.name,
                                 (long long)c.generated, (long long)c.verified);
            });
        return std::getenv("PTOOL_FUZZ_VERBOSE") == nullptr;
    }();
    ++g_runs;
    FuzzedDataProvider in(data, size);
    Gen g{in};
    bool three_d = false;
    const std::string model_text = g.model(three_d), plan_text = g.plan(three_d);
    if (!quiet) std::printf("--- model\n%s--- plan\n%s", model_text.c_str(), plan_text.c_str());
    std::vector<Section*> held;
    for (Section& c : g_sections)
        if (model_text.find(c.key) != std::string::npos || plan_text.find(c.key) != std::string::npos)
            ++c.generated, held.push_back(&c);
    try {
        ptool::VerifyJob job;
        job.inputs.model_path = "fuzz_model.yaml";
        job.inputs.model_text = model_text;
        job.plans = {ptool::load_plan_text(plan_text, "fuzz_plan.yaml")};
        job.options.steps = 1;
        job.options.comm.timeout_seconds = 30;
        const ptool::Model model = ptool::load_model_text(model_text, "fuzz_model.yaml", "", false);
        ptool::explain_plan(model, job.plans[0]);
        const auto launch = ptool::in_process_launch(ptool::Device::cpu, job.options.comm);
        const ptool::VerifyReport r = ptool::verify(job, *launch);  // a pass or a mismatch: both are results
        for (Section* c : held) ++c->verified;
        g_passed += r.pass;
        // PTOOL_FUZZ_MISMATCHES=DIR keeps the cases that fail with no warning or cause to explain it
        if (const char* dir = std::getenv("PTOOL_FUZZ_MISMATCHES");
            dir && !r.pass && r.plans[0].warnings.empty() && r.plans[0].notes.size() <= 1) {
            const std::string base = fmt::format("{}/case{}", dir, g_runs);
            std::FILE* f = std::fopen((base + ".model.yaml").c_str(), "w");
            if (f) std::fputs(model_text.c_str(), f), std::fclose(f);
            f = std::fopen((base + ".plan.yaml").c_str(), "w");
            if (f) std::fputs(plan_text.c_str(), f), std::fclose(f);
        }
    } catch (const ptool::InputError& e) {  // exit 2: the generator made something the lint refuses
        ++g_refused;
        if (std::getenv("PTOOL_FUZZ_REFUSALS")) {  // why, by section: what the generator should not make
            std::string held_names;
            for (const Section* c : held) held_names += std::string(" ") + c->name;
            std::fprintf(stderr, "refused [%s ]: %s\n", held_names.c_str(), e.what());
        }
    }
    return 0;
}
