// ptool import hf CONFIG.json / ptool import hf-tp-plan CONFIG.json: Hugging Face configs as
// ptool's model and plan files (import/hf_import.h).
#include "cli/commands.h"
#include "core/file_roles.h"
#include "core/files.h"
#include "import/hf_import.h"
#include "model/model.h"
#include "model/moe.h"
#include "parallel/plan.h"

namespace ptool::cli {
namespace {

// The imported file must load; when it does not, that is an import that missed a check of the
// config: reported at the config (exit 2), never at the file it would have written.
template <class Load>
void check_loads(const std::string& config, const HfImport& r, Load load) {
    try {
        load(r.yaml, config + " (imported)");
    } catch (const InputError& e) {
        throw InputError(SourceLocation{config, 0, 0},
                         fmt::format("the file it imports as does not load: {}", e.what()));
    }
}

void emit(const HfImport& r, const std::string& out, const std::string& what) {
    for (const std::string& w : r.warnings) fmt::print(stderr, "warning: {}\n", w);
    if (out.empty()) return fmt::print("{}", r.yaml);
    write_file(out, r.yaml, true);
    fmt::print("wrote {}: {}\n", out, what);
}

}  // namespace

void add_import_command(CLI::App& app) {
    CLI::App* imp = app.add_subcommand("import", "Turn other tools' files into ptool's");
    imp->require_subcommand(1);
    auto config = std::make_shared<std::string>(), out = std::make_shared<std::string>();
    auto opt = std::make_shared<HfImportOptions>();

    CLI::App* hf = imp->add_subcommand("hf",
                                       "A Hugging Face config.json (llama, mistral, qwen2, qwen3, mixtral, "
                                       "qwen2_moe, qwen3_moe, gpt2) as a model "
                                       "YAML with HF's names");
    hf->add_option("CONFIG", *config, "config.json")->required();
    hf->add_option("--batch", opt->batch, "rows per step (default 1)")
        ->transform(whole_number(1, int64_t{1} << 40));
    hf->add_option("--seq", opt->seq, "tokens per row (default min(max positions, 2048))")
        ->transform(whole_number(1, int64_t{1} << 40));
    hf->add_option("--attn", opt->attn,
                   "attention: flash (= sdpa, transformers' default, flash_attention_2/3, flex_attention: no "
                   "seq x seq scores kept) or eager (default: the config's attn_implementation, else sdpa)")
        ->check(CLI::IsMember(hf_attn_names()));
    hf->add_option("-o,--output", *out, "write the model here (default: print it)")->check(output_path());
    hf->callback([config, out, opt] {
        FileRoles().input("CONFIG", *config).output("-o", *out).check();
        if (!out->empty()) check_output(*out, true);
        const HfImport r = import_hf_model(*config, *opt);
        int64_t params = 0, inactive = 0;
        check_loads(*config, r, [&](const std::string& yaml, const std::string& name) {
            MetaAllocation meta;  // the file it writes must load; its count is HF's num_parameters()
            const Model m = load_model_text(yaml, name, "", false);
            for (const auto& [n, p] : m.named_parameters()) params += p->value.numel();
            inactive = inactive_parameters(*m.root);
        });
        emit(r, *out,
             inactive ? fmt::format("{} parameters, {} active per token", params, params - inactive)
                      : fmt::format("{} parameters", params));
    });

    CLI::App* tp = imp->add_subcommand("hf-tp-plan",
                                       "A model's transformers tp plan (base_model_tp_plan) as a plan YAML");
    tp->add_option("CONFIG", *config, "config.json")->required();
    tp->add_option("--tp", opt->tp, "tensor-parallel ranks of the plan's mesh (default 2)")
        ->transform(whole_number(1, 4096));
    tp->add_option("-o,--output", *out, "write the plan here (default: print it)")->check(output_path());
    tp->callback([config, out, opt] {
        FileRoles().input("CONFIG", *config).output("-o", *out).check();
        if (!out->empty()) check_output(*out, true);
        const HfImport r = import_hf_tp_plan(*config, *opt);
        check_loads(*config, r,
                    [](const std::string& yaml, const std::string& name) { load_plan_text(yaml, name); });
        emit(r, *out,
             "verify it with `ptool verify MODEL " + (out->empty() ? std::string("PLAN") : *out) + "`");
    });
}

}  // namespace ptool::cli
