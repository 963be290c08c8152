"""`ptool import hf` and `import hf-tp-plan` (docs/hf_import.md): parameter counts equal HF's,
parameters carry HF's names, refusals are exit 2 at the config's field, HF checkpoints (sharded,
GPT-2's Conv1D layout) load through --init with the values they hold, and imported models verify
under the imported tp plans.

    python3 tests/hf_import.py build/cli/ptool ."""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

from checks import Checks

PTOOL, ROOT = sys.argv[1], sys.argv[2]
HF = f"{ROOT}/tests/data/hf"
check = Checks()
tmp = tempfile.mkdtemp(prefix="ptool_hf_")


def run(*args):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def write_config(name, cfg):
    path = f"{tmp}/{name}.json"
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


def line_of(path, key):  # 1-based line of "key": in a JSON file
    for i, line in enumerate(open(path), 1):
        if f'"{key}"' in line:
            return i
    return -1


def write_safetensors(path, tensors):  # {name: (shape, [floats])}, F32
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        blob = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):  # {name: (shape, [floats])} for F32 tensors
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__" or h["dtype"] != "F32":
            continue
        b, e = h["data_offsets"]
        out[name] = (h["shape"], list(struct.unpack(f"<{(e - b) // 4}f", data[8 + n + b:8 + n + e])))
    return out


# 1. Parameter counts: HF's num_parameters() of the real configs.
for cfg, count in [("qwen2-0.5b", 494032768), ("mistral-7b-v0.3", 7248023552), ("gpt2", 124439808),
                   ("tinyllama-1.1b", 1100048384), ("llama-3.1-8b", 8030261248)]:
    out = f"{tmp}/{cfg}.yaml"
    rc, text = run("import", "hf", f"{HF}/{cfg}.json", "-o", out)
    check(rc == 0 and f": {count} parameters" in text, f"import {cfg}: {count} parameters expected, got rc {rc}: {text}")
    rc, text = run("explain", out, f"{ROOT}/plans/empty_plan.yaml", "--json", f"{tmp}/{cfg}.json.out")
    if check(rc == 0, f"explain {cfg}: rc {rc}: {text[-400:]}"):
        check(json.load(open(f"{tmp}/{cfg}.json.out"))["parameters"] == count, f"explain {cfg}: parameters != {count}")

# 1b. Mixtures of experts and Qwen3 (per-head q/k norms, head_dim of its own): the published
# totals, and the parameters a token uses (the top_k experts of each layer, the shared expert)
for cfg, count, active in [("mixtral-8x7b-v0.1", 46702792704, 12879925248),
                           ("qwen1.5-moe-a2.7b", 14315784192, 2689173504),
                           ("qwen3-30b-a3b", 30532122624, 3353032704),
                           ("qwen3-8b", 8190735360, None), ("qwen3-0.6b", 596049920, None),
                           # OLMo2 (norms after each block, q/k norms over whole projections): its
                           # published checkpoint index's total_size, 54864793600 float32 bytes
                           ("olmo-2-1124-13b", 13716198400, None)]:
    out = f"{tmp}/{cfg}.yaml"
    rc, text = run("import", "hf", f"{HF}/{cfg}.json", "-o", out)
    want = f": {count} parameters, {active} active per token" if active else f": {count} parameters\n"
    check(rc == 0 and want in text, f"import {cfg}: '{want.strip()}' expected, got rc {rc}: {text}")
    if os.environ.get("PTOOL_SANITIZER"):
        continue  # explain's count is the plain build's check: the import's is the one above (CI time)
    rc, text = run("explain", out, f"{ROOT}/plans/empty_plan.yaml", "--json", f"{tmp}/{cfg}.json.out")
    if check(rc == 0, f"explain {cfg}: rc {rc}: {text[-400:]}"):
        check(json.load(open(f"{tmp}/{cfg}.json.out"))["parameters"] == count, f"explain {cfg}: parameters != {count}")

# 1b'. OLMo2's layer: no norm before the blocks, one after each, q/k norms over the projections
olmo = open(f"{tmp}/olmo-2-1124-13b.yaml").read()
check("post_feedforward_layernorm" in olmo and "input_layernorm" not in olmo and "qk_norm: full" in olmo,
      f"olmo2's layer: {olmo[:1500]}")

# 1c. A Mixtral checkpoint's experts (w1, w3, w2) read as gate_proj, up_proj, down_proj
# (checkpoint_format: hf_mixtral): a tiny Mixtral's own initial state written under Mixtral's names
# and read back by --init gives the same values
mix_cfg = dict(json.load(open(f"{HF}/mixtral-8x7b-v0.1.json")), hidden_size=16, intermediate_size=24,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=32,
               num_local_experts=4, max_position_embeddings=64)
mix = f"{tmp}/tiny-mixtral.yaml"
rc, text = run("import", "hf", write_config("tiny-mixtral", mix_cfg), "--batch", "2", "--seq", "4", "-o", mix)
check(rc == 0 and "checkpoint_format: hf_mixtral" in open(mix).read(), f"import tiny-mixtral: {text}")
rc, text = run("run", mix, "--dump", f"{tmp}/mix_dump.safetensors")
if check(rc == 0, f"run tiny-mixtral: {text}"):
    own = {k[len("init.param."):]: v for k, v in read_safetensors(f"{tmp}/mix_dump.safetensors").items()
           if k.startswith("init.param.")}
    hf_names = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    renamed = {re.sub(r"(experts\.\d+\.)(gate_proj|up_proj|down_proj)", lambda m: m.group(1) + hf_names[m.group(2)], k): v
               for k, v in own.items()}
    check(any(".experts.0.w1.weight" in k for k in renamed), f"no w1 among {sorted(renamed)[:6]}")
    write_safetensors(f"{tmp}/mix_hf.safetensors", renamed)
    rc, text = run("run", mix, "--init", f"{tmp}/mix_hf.safetensors", "--dump", f"{tmp}/mix_back.safetensors")
    if check(rc == 0, f"run tiny-mixtral --init (Mixtral's names): {text}"):
        back = read_safetensors(f"{tmp}/mix_back.safetensors")
        bad = [k for k, v in own.items() if back.get("init.param." + k) != v]
        check(not bad, f"--init of Mixtral's names differs for {bad[:4]}")

# 2. Names: a tiny Qwen2's parameters are HF's state_dict names (q/k/v biased, o not; tied head).
qwen = f"{tmp}/tiny-qwen2.yaml"
rc, text = run("import", "hf", f"{HF}/tiny-qwen2.json", "--batch", "2", "--seq", "8", "-o", qwen)
check(rc == 0, f"import tiny-qwen2: {text}")
rc, text = run("run", qwen, "--dump", f"{tmp}/qwen_dump.safetensors")
check(rc == 0, f"run tiny-qwen2: {text}")
names = {k[len("init.param."):] for k in read_safetensors(f"{tmp}/qwen_dump.safetensors") if k.startswith("init.param.")}
want = {"model.embed_tokens.weight", "model.norm.weight"}
for i in range(2):
    p = f"model.layers.{i}."
    want |= {p + f"self_attn.{x}_proj.{w}" for x in "qkv" for w in ("weight", "bias")} | {p + "self_attn.o_proj.weight"}
    want |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
    want |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
check(names == want, f"tiny-qwen2 parameter names: extra {sorted(names - want)}, missing {sorted(want - names)}")

# 2b. Names: a tiny Qwen2-MoE's and Qwen3-MoE's are HF's (router `gate`, experts.N, the shared
# expert and its gate; q_norm and k_norm), and each verifies under DDP
for fam, extra in (("qwen2_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                      shared_expert_intermediate_size=24)),
                   ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, head_dim=16,
                                      norm_topk_prob=True))):
    cfg = dict(json.load(open(f"{HF}/tiny-qwen2.json")), model_type=fam, **extra)
    path = write_config(f"tiny-{fam}", cfg)
    out = f"{tmp}/tiny-{fam}.yaml"
    rc, text = run("import", "hf", path, "--batch", "2", "--seq", "8", "-o", out)
    check(rc == 0, f"import tiny {fam}: {text}")
    rc, text = run("run", out, "--dump", f"{tmp}/{fam}_dump.safetensors")
    check(rc == 0, f"run tiny {fam}: {text}")
    names = {k[len("init.param."):] for k in read_safetensors(f"{tmp}/{fam}_dump.safetensors") if k.startswith("init.param.")}
    p = "model.layers.0."
    want = {p + "mlp.gate.weight"} | {p + f"mlp.experts.{e}.{x}_proj.weight" for e in range(4) for x in ("gate", "up", "down")}
    if fam == "qwen2_moe":
        want |= {p + f"mlp.shared_expert.{x}_proj.weight" for x in ("gate", "up", "down")} | {p + "mlp.shared_expert_gate.weight"}
    else:
        want |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"}
    check(want <= names, f"tiny {fam} parameter names: missing {sorted(want - names)}")
    plan = f"{tmp}/ddp_{fam}.yaml"
    open(plan, "w").write("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicate}\n")
    rc, text = run("verify", out, plan)
    check(rc == 0 and "PASS" in text, f"verify tiny {fam} under DDP: rc {rc}: {text[-800:]}")

# 3. Refusals: exit 2 at file:line:column of the field.
base = json.load(open(f"{HF}/tiny-qwen2.json"))
refusals = [
    ("unknown model_type", dict(base, model_type="gemma"), "model_type", "gemma"),
    ("sliding window shorter than the sequence", dict(base, model_type="mistral", sliding_window=4), "sliding_window", "sliding-window"),
    ("qwen2 sliding window on", dict(base, use_sliding_window=True, sliding_window=4, max_window_layers=0), "sliding_window", "sliding-window"),
    ("qwen2 sliding window on its last layer",
     dict(base, use_sliding_window=True, sliding_window=4, max_window_layers=base["num_hidden_layers"] - 1),
     "sliding_window", "sliding-window"),
    ("layer_types with a sliding layer", dict(base, model_type="mistral", sliding_window=4,
                                              layer_types=["full_attention"] * (base["num_hidden_layers"] - 1) + ["sliding_attention"]),
     "sliding_window", "sliding-window"),
    ("layer_types of another length", dict(base, model_type="mistral", sliding_window=4, layer_types=["full_attention"]),
     "layer_types", "lists 1 layers"),
    ("rope_scaling yarn", dict(base, rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling", "'yarn' is not modelled"),
    ("rope_scaling without factor", dict(base, rope_scaling={"rope_type": "linear"}), "rope_scaling", "factor"),
    ("MoE", dict(base, num_local_experts=8), "num_local_experts", "experts"),
    ("head_dim", dict(base, head_dim=16), "head_dim", "head_dim"),
    ("MoE layers among dense", dict(base, model_type="qwen3_moe", mlp_only_layers=[0]), "mlp_only_layers", "dense"),
    ("MoE every other layer", dict(base, model_type="qwen2_moe", decoder_sparse_step=2), "decoder_sparse_step", "alternate"),
    ("top_k over experts", dict(base, model_type="mixtral", num_local_experts=2, num_experts_per_tok=3),
     "num_experts_per_tok", "more than"),
    ("activation", dict(base, hidden_act="quick_gelu"), "hidden_act", "quick_gelu"),
    ("heads", dict(base, num_attention_heads=5), "num_attention_heads", "multiple"),
]
for what, cfg, key, fragment in refusals:
    path = write_config(what.replace(" ", "_"), cfg)
    rc, text = run("import", "hf", path, "--seq", "8")
    at = f"{path}:{line_of(path, key)}:"
    check(rc == 2 and at in text and fragment in text, f"{what}: exit 2 at {at} naming '{fragment}' expected, got {rc}: {text}")
rc, text = run("import", "hf", f"{HF}/llama-3.1-8b.json")
check(rc == 0 and "rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
      "original_max_position_embeddings: 8192.0}" in text, f"Llama 3.1's rope_scaling carried over: {text[-600:]}")
rc, text = run("import", "hf", write_config("window_ok", dict(base, model_type="mistral", sliding_window=8)), "--seq", "8")
check(rc == 0, f"a sliding window as long as the sequence is causal attention: {text}")
# a window on no layer: Qwen's from max_window_layers on (none when it is the layer count), a
# config's layer_types all full attention (transformers' layer_types rule)
for what, cfg in (("qwen2 max_window_layers = layers", dict(base, use_sliding_window=True, sliding_window=4,
                                                             max_window_layers=base["num_hidden_layers"])),
                  ("layer_types all full", dict(base, model_type="mistral", sliding_window=4,
                                                layer_types=["full_attention"] * base["num_hidden_layers"]))):
    rc, text = run("import", "hf", write_config(what.replace(" ", "_").replace("=", ""), cfg), "--seq", "8")
    check(rc == 0, f"{what}: no layer slides, accepted: {text}")

# 3a. transformers 5's rope_parameters (LlamaConfig and the others have no rope_theta/rope_scaling
# field there: a saved config carries {"rope_theta": ..., "rope_type": ..., and the type's keys}):
# read as the top-level rope_theta and rope_scaling are, the same model as the transformers 4 form;
# forms that disagree and RoPE per layer type are exit 2 at the field.
def attention_of(path, *args):
    rc, text = run("import", "hf", path, "--seq", "8", *args)
    lines = attn_lines(text) if rc == 0 else []
    return rc, (lines[0] if lines else text)


def attn_lines(text):
    return re.findall(r"type: attention, .*", text)


tiny = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 96, "max_position_embeddings": 64}
llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
want3 = ("rope_theta: 500000.0, rope_scaling: {type: llama3, factor: 8.0, low_freq_factor: 1.0, high_freq_factor: 4.0, "
         "original_max_position_embeddings: 16.0}")
rc, v5 = attention_of(write_config("rope_v5", dict(tiny, rope_parameters=dict(llama3, rope_theta=500000.0))))
check(rc == 0 and want3 in v5, f"rope_parameters llama3 (transformers 5): '{want3}' expected, got rc {rc}: {v5}")
rc, v4 = attention_of(write_config("rope_v4", dict(tiny, rope_theta=500000.0, rope_scaling=llama3)))
check(rc == 0 and v4 == v5, f"the transformers 4 form of the same RoPE writes the same attention: {v4} vs {v5}")
for what, cfg, want in [
        ("rope_parameters default", dict(tiny, rope_parameters={"rope_type": "default", "rope_theta": 500000.0}),
         "rope_theta: 500000.0, qkv_bias"),
        ("rope_parameters without rope_type", dict(tiny, rope_parameters={"rope_theta": 250000.0}), "rope_theta: 250000.0, qkv_bias"),
        ("rope_parameters without rope_theta: the class's", dict(tiny, model_type="mixtral", rope_parameters={"rope_type": "default"}),
         "rope_theta: 1000000.0, qkv_bias"),
        ("rope_parameters' theta with the same top-level one", dict(tiny, rope_theta=5e5, rope_parameters={"rope_theta": 5e5}),
         "rope_theta: 500000.0, qkv_bias"),
        ("rope_parameters' 'type' (transformers' alias), linear", dict(tiny, rope_parameters={"type": "linear", "factor": 2.0}),
         "rope_theta: 10000.0, rope_scaling: {type: linear, factor: 2.0}"),
        ("rope_parameters llama3 without original_max_position_embeddings: max_position_embeddings",
         dict(tiny, rope_parameters={k: v for k, v in llama3.items() if k != "original_max_position_embeddings"}),
         "original_max_position_embeddings: 64.0}"),
        ("both forms agreeing", dict(tiny, rope_theta=5e5, rope_scaling=llama3, rope_parameters=dict(llama3, rope_theta=5e5)), want3),
        ("rope_parameters null", dict(tiny, rope_parameters=None), "rope_theta: 10000.0, qkv_bias")]:
    rc, line = attention_of(write_config("rope_ok", cfg))
    check(rc == 0 and want in line, f"{what}: '{want}' expected, got rc {rc}: {line}")


def nested_line(path, outer, key):  # 1-based line of "key": after the line of "outer":
    lines = open(path).read().split("\n")
    start = line_of(path, outer)
    return next(i for i in range(start, len(lines) + 1) if f'"{key}"' in lines[i - 1])


for what, cfg, outer, key, fragment in [
        ("theta in both forms, differing", dict(tiny, rope_parameters={"rope_theta": 500000.0}, rope_theta=10000.0),
         "rope_parameters", "rope_theta", "disagrees with 'rope_theta' 10000.0"),
        ("scaling in both forms, differing", dict(tiny, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_parameters=llama3),
         None, "rope_parameters", "disagrees with 'rope_scaling'"),
        ("rope_parameters per layer type", dict(tiny, rope_parameters={"full_attention": dict(llama3, rope_theta=5e5),
                                                                       "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
         None, "full_attention", "per layer type"),
        ("rope_parameters yarn", dict(tiny, rope_parameters={"rope_type": "yarn", "factor": 4.0}), None, "rope_parameters",
         "'yarn' is not modelled"),
        ("rope_parameters partial rotary", dict(tiny, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
         "rope_parameters", "partial_rotary_factor", "not modelled"),
        ("rope_parameters llama3 without factor", dict(tiny, rope_parameters={"rope_type": "llama3"}), None, "rope_parameters", "factor"),
        ("rope_parameters not an object", dict(tiny, rope_parameters=5e5), None, "rope_parameters", "must be an object")]:
    path = write_config("rope_bad", cfg)
    rc, text = run("import", "hf", path, "--seq", "8")
    at = f"{path}:{nested_line(path, outer, key) if outer else line_of(path, key)}:"
    check(rc == 2 and at in text and fragment in text, f"{what}: exit 2 at {at} naming '{fragment}' expected, got {rc}: {text}")

# 3a'. A null where the config class resolves None is its resolution, not a refusal: GPT-2's n_inner
# (save_pretrained writes it: 4 x n_embd, GPT2Block), num_key_value_heads (the heads, where the class
# says so: not Mistral's default 8), head_dim (hidden / heads in Llama, Mistral, Mixtral). A null the
# class keeps, and cannot build with, stays exit 2 at it: Qwen3's head_dim (typed int; Qwen3Attention
# reads None), Qwen2's and OLMo2's (no field: getattr reads None), Qwen3-MoE's num_key_value_heads
# (typed int, never resolved).
gpt2_null = write_config("gpt2_n_inner_null", dict(json.load(open(f"{HF}/gpt2.json")), n_inner=None))
rc, text = run("import", "hf", gpt2_null, "-o", f"{tmp}/gpt2_null.yaml")
check(rc == 0 and ": 124439808 parameters" in text and "c_fc, type: linear, in: 768, out: 3072" in open(f"{tmp}/gpt2_null.yaml").read(),
      f"GPT-2 with n_inner null (as saved): 124439808 parameters, c_fc 768 -> 3072 expected, got rc {rc}: {text}")
for what, cfg, want in [
        ("mistral num_key_value_heads null", dict(tiny, model_type="mistral", num_key_value_heads=None), "heads: 4, kv_heads: 4,"),
        ("olmo2 num_key_value_heads null", dict(tiny, model_type="olmo2", num_key_value_heads=None), "heads: 4, kv_heads: 4,"),
        ("llama head_dim null", dict(tiny, head_dim=None), "heads: 4, kv_heads: 2,"),
        ("mixtral head_dim null", dict(tiny, model_type="mixtral", head_dim=None, num_local_experts=2), "heads: 4, kv_heads: 2,")]:
    rc, line = attention_of(write_config("null_ok", cfg))
    check(rc == 0 and want in line, f"{what}: '{want}' expected, got rc {rc}: {line}")
for what, cfg, key in [("qwen3 head_dim null", dict(tiny, model_type="qwen3", head_dim=None), "head_dim"),
                       ("qwen2 head_dim null", dict(tiny, model_type="qwen2", head_dim=None), "head_dim"),
                       ("olmo2 head_dim null", dict(tiny, model_type="olmo2", head_dim=None), "head_dim"),
                       ("qwen3_moe num_key_value_heads null", dict(tiny, model_type="qwen3_moe", num_key_value_heads=None,
                                                                   num_experts=2, num_experts_per_tok=1), "num_key_value_heads")]:
    path = write_config("null_bad", cfg)
    rc, text = run("import", "hf", path, "--seq", "8")
    at = f"{path}:{line_of(path, key)}:"
    check(rc == 2 and at in text and "is null" in text, f"{what}: exit 2 at {at} expected, got {rc}: {text}")

# 3a''. Each family's config class's defaults for the fields a config omits (transformers main:
# configuration_<family>.py; docs/hf_import.md's table): rms_norm_eps, rope_theta,
# num_key_value_heads, tie_word_embeddings. A config of sizes only shows each.
bare = {k: v for k, v in tiny.items() if k != "num_key_value_heads"}
families = {  # model_type: (eps, theta, kv_heads of 4 heads, tied)
    "llama": ("1e-06", "10000.0", 4, False), "mistral": ("1e-06", "10000.0", 8, False),
    "qwen2": ("1e-06", "10000.0", 32, False), "qwen3": ("1e-06", "10000.0", 32, False),
    "olmo2": ("1e-05", "10000.0", 4, False), "mixtral": ("1e-05", "1000000.0", 8, False),
    "qwen2_moe": ("1e-06", "10000.0", 16, False), "qwen3_moe": ("1e-06", "10000.0", 4, False)}
for fam, (eps, theta, kv, tied) in families.items():
    cfg = dict(bare, model_type=fam, num_attention_heads=4 if kv <= 4 else kv, hidden_size=32 if kv <= 4 else 8 * kv)
    if fam == "qwen3":
        cfg["head_dim"] = 8
    if fam in ("mixtral", "qwen2_moe", "qwen3_moe"):
        cfg.update({"num_local_experts" if fam == "mixtral" else "num_experts": 2, "num_experts_per_tok": 1})
    out = f"{tmp}/defaults_{fam}.yaml"
    rc, text = run("import", "hf", write_config(f"defaults_{fam}", cfg), "--seq", "8", "-o", out)
    if not check(rc == 0, f"{fam} of sizes only: rc {rc}: {text}"):
        continue
    y = open(out).read()
    got = (re.search(r" eps: ([0-9e.+-]+)", y).group(1), re.search(r"rope_theta: ([0-9.e+]+)", y).group(1),
           int(re.search(r"kv_heads: (\d+)", y).group(1)), "tie: model.embed_tokens" in y)
    check(got == (eps, theta, kv, tied), f"{fam}'s class defaults (eps, theta, kv_heads, tied): {(eps, theta, kv, tied)} expected, got {got}")
rc, text = run("import", "hf", write_config("gpt2_bare", {"model_type": "gpt2", "n_embd": 32, "n_head": 4, "n_layer": 2,
                                                          "vocab_size": 96, "n_positions": 64}), "--seq", "8")
check(rc == 0 and "type: layer_norm, dim: 32, eps: 1e-05}" in text and "tie: transformer.wte" in text
      and "c_fc, type: linear, in: 32, out: 128}" in text, f"GPT2Config's defaults (eps 1e-5, tied, n_inner 4 x n_embd): rc {rc}: {text[-1500:]}")

# 3b. Attention: transformers' default, sdpa, keeps no [B*H, T, T] scores, which the model format's
# `flash` models; --attn wins over the config's attn_implementation (or _attn_implementation), the
# config over the default; the header says which and why (attn_lines: above, 3a).
def imported(*args):
    p = subprocess.run([PTOOL, "import", "hf", *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


llama31 = f"{HF}/tiny-llama31.json"
for cfg in ("tiny-llama31", "tiny-qwen2", "tiny-gpt2", "llama-3.1-8b", "gpt2"):
    rc, out, err = imported(f"{HF}/{cfg}.json")
    lines = attn_lines(out)
    check(rc == 0 and lines and all("attn_implementation: flash" in a for a in lines)
          and "# Attention: flash (transformers' default attn_implementation \"sdpa\").\n" in out,
          f"import {cfg}: flash by default expected, got rc {rc}: {lines}\n{out[:900]}{err}")
    rc, out, err = imported(f"{HF}/{cfg}.json", "--attn", "eager")
    lines = attn_lines(out)
    check(rc == 0 and lines and all("attn_implementation: eager" in a for a in lines) and "# Attention: eager (--attn eager).\n" in out,
          f"import {cfg} --attn eager: got rc {rc}: {lines}\n{out[:900]}{err}")
for flag, impl in (("flash", "flash"), ("sdpa", "flash"), ("flash_attention_2", "flash"), ("flash_attention_3", "flash"),
                   ("flex_attention", "flash"), ("eager", "eager")):
    rc, out, err = imported(llama31, "--attn", flag)
    check(rc == 0 and f"attn_implementation: {impl}," in out and f"# Attention: {impl} (--attn {flag}).\n" in out,
          f"--attn {flag}: {impl} expected, got rc {rc}: {attn_lines(out)}{err}")
cfg31 = json.load(open(llama31))
for key in ("attn_implementation", "_attn_implementation"):
    path = write_config(f"attn_{key}", dict(cfg31, **{key: "eager"}))
    rc, out, err = imported(path)
    check(rc == 0 and "attn_implementation: eager," in out and f"# Attention: eager (the config's {key} \"eager\").\n" in out,
          f"the config's {key} eager: got rc {rc}: {attn_lines(out)}\n{out[:900]}{err}")
    rc, out, err = imported(path, "--attn", "sdpa")  # the flag wins over the config
    check(rc == 0 and "attn_implementation: flash," in out and "# Attention: flash (--attn sdpa).\n" in out,
          f"--attn sdpa over the config's {key} eager: got rc {rc}: {attn_lines(out)}{err}")
path = write_config("attn_fa2", dict(cfg31, attn_implementation="flash_attention_2"))
rc, out, err = imported(path)
check(rc == 0 and "attn_implementation: flash," in out and "the config's attn_implementation \"flash_attention_2\"" in out,
      f"the config's flash_attention_2: got rc {rc}: {attn_lines(out)}{err}")
path = write_config("attn_null", dict(cfg31, _attn_implementation=None))  # null: unset
rc, out, err = imported(path)
check(rc == 0 and "attn_implementation: flash," in out and "transformers' default" in out, f"_attn_implementation null: rc {rc}: {err}")
for what, cfg, key, fragment in [
        ("an attention ptool does not model", dict(cfg31, attn_implementation="paged_attention"), "attn_implementation",
         "'paged_attention' is not an attention ptool models"),
        ("a misspelt one", dict(cfg31, _attn_implementation="sdpa2"), "_attn_implementation", "did you mean 'sdpa'"),
        ("not a string", dict(cfg31, attn_implementation=2), "attn_implementation", "attn_implementation"),
        ("two that disagree", dict(cfg31, attn_implementation="sdpa", _attn_implementation="eager"), "_attn_implementation",
         "disagrees with 'attn_implementation'")]:
    path = write_config("attn_bad", cfg)
    rc, out, err = imported(path)
    at = f"{path}:{line_of(path, key)}:"
    check(rc == 2 and at in err and fragment in err and not out, f"{what}: exit 2 at {at} naming '{fragment}' expected, got {rc}: {out}{err}")
    rc, out, err = imported(path, "--attn", "eager")  # the flag wins: the config's value is not read
    check(rc == 0 and "attn_implementation: eager," in out, f"{what} under --attn eager: rc {rc}: {err}")
rc, out, err = imported(llama31, "--attn", "sdpa2")
check(rc == 2 and "--attn" in err and "eager" in err and "sdpa" in err and not out, f"--attn sdpa2: exit 2 naming the choices expected, got {rc}: {out}{err}")

# The shipped imported models are what the import writes now (flash attention, its header).
for cfg, model in (("tiny-qwen2", "hf_tiny_qwen2"), ("tiny-gpt2", "hf_tiny_gpt2"), ("tiny-llama31", "hf_tiny_llama31")):
    p = subprocess.run([os.path.abspath(PTOOL), "import", "hf", f"tests/data/hf/{cfg}.json", "--batch", "2", "--seq", "8"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)  # the header names the config as given
    rc, out = p.returncode, p.stdout
    check(rc == 0 and out == open(f"{ROOT}/models/{model}.yaml").read(),
          f"models/{model}.yaml is not `ptool import hf tests/data/hf/{cfg}.json --batch 2 --seq 8` (rc {rc}; re-import it)")

# Imported models start where real training starts (transformers' _init_weights: linears and the tied
# embedding ~ N(0, initializer_range), biases 0): Llama-3.2-1B's config (tests/data/hf/llama-3.2-1b.json,
# the one ../shared/gpu measured) narrowed to one layer of width 512, its full 128256-token vocabulary,
# starts at a loss within 5% of ln(vocab) on random tokens (ln V + d std^2 / 2 = 11.86 expected;
# transformers' own 16-layer model: 12.18). PyTorch's module defaults (no init key) start at ~500.
import math  # noqa: E402
cfg32 = json.load(open(f"{HF}/llama-3.2-1b.json"))
narrow = write_config("llama32_narrow", dict(cfg32, num_hidden_layers=1, hidden_size=512, intermediate_size=2048,
                                             num_attention_heads=8, num_key_value_heads=2))
rc, text = run("import", "hf", narrow, "--batch", "2", "--seq", "32", "-o", f"{tmp}/llama32_narrow.yaml")
check(rc == 0 and "init: {std: 0.02}" in open(f"{tmp}/llama32_narrow.yaml").read(), f"import of {narrow}: {rc} {text}")
rc, text = run("run", f"{tmp}/llama32_narrow.yaml", "--steps", "1")
first = re.search(r"step +0 +loss ([0-9.]+)", text)
ln_v = math.log(cfg32["vocab_size"])
check(rc == 0 and first and abs(float(first.group(1)) / ln_v - 1) < 0.05,
      f"an imported Llama's first loss on random tokens: {first and first.group(1)}, ln(vocab) {ln_v:.3f}: {text}")

# explain's memory at a long sequence: eager keeps each layer's softmax probabilities [B*H, T, T]
# (S bytes) for backward and makes dp and ds (2 S) in the last layer's backward, where both peak at
# T = 256; flash keeps none and holds at most one head's p, dp and ds (3 S / (B H)) there: a tile
# of 128 of its query rows at a time (model/modules/attention.cpp), with its causal mask. The
# steady-state peak and its activations then drop by between (L + 2) S - 3 S / (B H) and (L + 2) S.
B, T, H, L = 2, 256, cfg31["num_attention_heads"], cfg31["num_hidden_layers"]
one = f"{tmp}/one.yaml"
with open(one, "w") as f:
    f.write("mesh: {world: 1}\n")
mem = {}
for impl in ("eager", "flash"):
    model, ej = f"{tmp}/llama_{impl}.yaml", f"{tmp}/llama_{impl}.json"
    rc, text = run("import", "hf", llama31, "--batch", str(B), "--seq", str(T), "--attn", impl, "-o", model)
    check(rc == 0, f"import --attn {impl}: {text}")
    rc, text = run("explain", model, one, "--json", ej)
    if check(rc == 0, f"explain --attn {impl}: rc {rc}: {text[-600:]}"):
        mem[impl] = json.load(open(ej))["memory"][0]
if len(mem) == 2:
    S = B * H * T * T * 4  # float32
    least, most = (L + 2) * S - 3 * S // (B * H), (L + 2) * S
    drop = mem["eager"]["predicted_peak_bytes"] - mem["flash"]["predicted_peak_bytes"]
    act = mem["eager"]["at_peak"]["activations"] - mem["flash"]["at_peak"]["activations"]
    check(least <= drop <= most and act == drop, f"eager -> flash at T {T}: peak drops {drop} B, activations {act} B; "
          f"(L + 2) S - 3 S / (B H) = {least} B, (L + 2) S = {most} B (S = {S} B)")
    print(f"tiny Llama 3.1 at {B} x {T} tokens: peak eager {mem['eager']['predicted_peak_bytes']:,} B, "
          f"flash {mem['flash']['predicted_peak_bytes']:,} B")

# 4. hf-tp-plan: the family plan, mapped styles, refusals at the entry.
rc, text = run("import", "hf-tp-plan", f"{HF}/tiny-qwen2.json", "--tp", "2", "-o", f"{tmp}/qwen_tp.yaml")
check(rc == 0, f"hf-tp-plan tiny-qwen2: {text}")
plan = open(f"{tmp}/qwen_tp.yaml").read()
check('"model.layers.*.self_attn.o_proj": rowwise' in plan and "model.embed_tokens: rowwise" in plan and
      "lm_head: {style: colwise, output_layouts: replicate}" in plan, f"qwen tp plan:\n{plan}")
rc, text = run("verify", qwen, f"{tmp}/qwen_tp.yaml", "--steps", "2")
check(rc == 0 and "PASS" in text, f"verify tiny-qwen2 under its hf tp plan: {text[-600:]}")
own = write_config("own_plan", dict(base, base_model_tp_plan={"layers.*.mlp.gate_proj": "local_colwise",
                                                              "layers.*.mlp.up_proj": "local_colwise",
                                                              "layers.*.mlp.down_proj": "local_rowwise"}))
rc, text = run("import", "hf-tp-plan", own)
check(rc == 0 and '"model.layers.*.mlp.gate_proj": colwise' in text and "self_attn" not in text,
      f"the config's own base_model_tp_plan, local_* as their styles: {text}")
bad = write_config("gather_plan", dict(base, base_model_tp_plan={"layers.*.mlp.gate_proj": "colwise", "layers.*.mlp": "gather"}))
rc, text = run("import", "hf-tp-plan", bad)
check(rc == 2 and f"{bad}:{line_of(bad, 'layers.*.mlp')}:" in text and "GatherParallel" in text,
      f"gather refused at its entry: {rc}: {text}")
rc, text = run("import", "hf-tp-plan", f"{HF}/gpt2.json")
check(rc == 2 and "GPT-2 has no base_model_tp_plan" in text, f"gpt2 tp plan refused: {rc}: {text}")
# Mixtral's class plan: the router colwise_rep, each expert's w1/w3 colwise and w2 rowwise, under the
# imported names (gate_proj, up_proj, down_proj), verifies on the tiny Mixtral (4 experts) at tp 2
rc, text = run("import", "hf-tp-plan", f"{tmp}/tiny-mixtral.json", "--tp", "2", "-o", f"{tmp}/mixtral_tp.yaml")
plan = open(f"{tmp}/mixtral_tp.yaml").read() if rc == 0 else text
check('"model.layers.*.block_sparse_moe.gate": {style: colwise, output_layouts: replicate}' in plan and
      '"model.layers.*.block_sparse_moe.experts.*.gate_proj": colwise' in plan and
      '"model.layers.*.block_sparse_moe.experts.*.down_proj": rowwise' in plan and
      '"model.layers.*.block_sparse_moe.experts.*.up_proj": colwise' in plan and ".w1" not in plan,
      f"mixtral tp plan:\n{plan}")
rc, text = run("verify", mix, f"{tmp}/mixtral_tp.yaml", "--steps", "2")
check(rc == 0 and "PASS" in text, f"verify tiny-mixtral under its hf tp plan: {text[-600:]}")
qmoe = write_config("qwen_moe_own", dict(json.load(open(f"{HF}/qwen3-30b-a3b.json")),
                                         base_model_tp_plan={"layers.*.mlp.experts": "gather"}))
rc, text = run("import", "hf-tp-plan", qmoe)
check(rc == 2 and "GatherParallel" in text, f"a MoE plan's gather refused: {rc}: {text}")

# 5. GPT-2: HF's checkpoint layout (no "transformer." prefix, Conv1D [in, out], fused c_attn, mask
# buffers), sharded over two files with an index, loads into the imported model's parameters.
gpt = f"{tmp}/tiny-gpt2.yaml"
rc, text = run("import", "hf", f"{HF}/tiny-gpt2.json", "--batch", "2", "--seq", "8", "-o", gpt)
check(rc == 0 and ": 28544 parameters" in text, f"import tiny-gpt2: {text}")
cfg = json.load(open(f"{HF}/tiny-gpt2.json"))
D, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
counter = [0]


def values(n):
    counter[0] += 1
    v = [((i * 7919 + counter[0] * 104729) % 2001 - 1000) / 4000.0 for i in range(n)]
    return list(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *v)))  # float32 values


hf = {"wte.weight": ([V, D], values(V * D)), "wpe.weight": ([P, D], values(P * D)),
      "ln_f.weight": ([D], values(D)), "ln_f.bias": ([D], values(D))}
for i in range(L):
    p = f"h.{i}."
    for ln in ("ln_1", "ln_2"):
        hf[p + ln + ".weight"], hf[p + ln + ".bias"] = ([D], values(D)), ([D], values(D))
    hf[p + "attn.c_attn.weight"], hf[p + "attn.c_attn.bias"] = ([D, 3 * D], values(3 * D * D)), ([3 * D], values(3 * D))
    hf[p + "attn.c_proj.weight"], hf[p + "attn.c_proj.bias"] = ([D, D], values(D * D)), ([D], values(D))
    hf[p + "mlp.c_fc.weight"], hf[p + "mlp.c_fc.bias"] = ([D, 4 * D], values(4 * D * D)), ([4 * D], values(4 * D))
    hf[p + "mlp.c_proj.weight"], hf[p + "mlp.c_proj.bias"] = ([4 * D, D], values(4 * D * D)), ([D], values(D))
    hf[p + "attn.bias"] = ([1, 1, P, P], [1.0] * (P * P))  # the causal mask buffer old checkpoints carry
names_sorted = sorted(hf)
half = len(names_sorted) // 2
shards = {"model-00001-of-00002.safetensors": names_sorted[:half], "model-00002-of-00002.safetensors": names_sorted[half:]}
for shard, keys in shards.items():
    write_safetensors(f"{tmp}/{shard}", {k: hf[k] for k in keys})
index = {"metadata": {"total_size": 0}, "weight_map": {k: s for s, keys in shards.items() for k in keys}}
with open(f"{tmp}/model.safetensors.index.json", "w") as f:
    json.dump(index, f, indent=2)


def transpose(shape, v):
    r, c = shape
    return [v[i * c + j] for j in range(c) for i in range(r)]


expect = {"transformer.wte.weight": hf["wte.weight"][1], "transformer.wpe.weight": hf["wpe.weight"][1],
          "transformer.ln_f.weight": hf["ln_f.weight"][1]}
for i in range(L):
    p = f"h.{i}."
    w = transpose([D, 3 * D], hf[p + "attn.c_attn.weight"][1])  # [3D, D]: q rows, then k, then v
    for j, x in enumerate("qkv"):
        expect[f"transformer.{p}attn.{x}_proj.weight"] = w[j * D * D:(j + 1) * D * D]
        expect[f"transformer.{p}attn.{x}_proj.bias"] = hf[p + "attn.c_attn.bias"][1][j * D:(j + 1) * D]
    expect[f"transformer.{p}attn.o_proj.weight"] = transpose([D, D], hf[p + "attn.c_proj.weight"][1])
    expect[f"transformer.{p}mlp.c_fc.weight"] = transpose([D, 4 * D], hf[p + "mlp.c_fc.weight"][1])
    expect[f"transformer.{p}mlp.c_proj.weight"] = transpose([4 * D, D], hf[p + "mlp.c_proj.weight"][1])
    expect[f"transformer.{p}ln_2.bias"] = hf[p + "ln_2.bias"][1]
rc, text = run("run", gpt, "--init", f"{tmp}/model.safetensors.index.json", "--dump", f"{tmp}/gpt_dump.safetensors")
if check(rc == 0, f"run tiny-gpt2 --init index: {text}"):
    dump = read_safetensors(f"{tmp}/gpt_dump.safetensors")
    bad = [k for k, v in expect.items() if dump.get("init.param." + k, (None, None))[1] != v]
    check(not bad, f"--init values differ from the checkpoint's (split/transposed) for {bad[:4]}")
gpt_tp = f"{tmp}/gpt_tp.yaml"
with open(gpt_tp, "w") as f:
    f.write("mesh: {tp: 2}\ntensor_parallel:\n  plan:\n    transformer.wte: rowwise\n"
            '    "transformer.h.*.attn.[qkv]_proj": colwise\n    "transformer.h.*.attn.o_proj": rowwise\n'
            '    "transformer.h.*.mlp.c_fc": colwise\n    "transformer.h.*.mlp.c_proj": rowwise\n'
            "    lm_head: {style: colwise, output_layouts: replicate}\n")
rc, text = run("verify", gpt, gpt_tp, "--init", f"{tmp}/model.safetensors.index.json", "--steps", "2")
check(rc == 0 and "PASS" in text, f"verify tiny-gpt2 from the HF checkpoint under TP: {text[-600:]}")

# A damaged index: a shard path outside its directory, a tensor the index puts elsewhere.
broken = dict(index, weight_map=dict(index["weight_map"], **{"wte.weight": "../model-00001-of-00002.safetensors"}))
with open(f"{tmp}/broken.index.json", "w") as f:
    json.dump(broken, f, indent=2)
rc, text = run("run", gpt, "--init", f"{tmp}/broken.index.json")
check(rc == 2 and "broken.index.json:" in text and "plain file name" in text, f"shard path with '/': {rc}: {text}")
moved = dict(index, weight_map={k: ("model-00002-of-00002.safetensors" if k == names_sorted[0] else v)
                                for k, v in index["weight_map"].items()})
with open(f"{tmp}/moved.index.json", "w") as f:
    json.dump(moved, f, indent=2)
rc, text = run("run", gpt, "--init", f"{tmp}/moved.index.json")
check(rc == 2 and names_sorted[0] in text, f"a tensor in another shard than the index says: {rc}: {text}")

# position_embedding needs whole sequences: a sequence-sharded input is a lint error at the plan.
seq_plan = f"{tmp}/gpt_seq.yaml"
with open(seq_plan, "w") as f:
    f.write("mesh: {tp: 2}\ntensor_parallel:\n  plan:\n"
            "    transformer.wte: {style: rowwise, input_layouts: replicate, output_layouts: shard(1)}\n"
            "    lm_head: {style: colwise, output_layouts: replicate}\n")
rc, text = run("explain", gpt, seq_plan)
check(rc == 2 and "position_embedding" in text and "whole sequences" in text, f"wpe on sequence shards: {rc}: {text}")
# Transparent containers: their children's names share the parent's namespace.
dup = f"{tmp}/dup.yaml"
with open(dup, "w") as f:
    f.write("batch: {input: [2, 4]}\nmodules:\n"
            "  - type: residual\n    modules: [{name: norm, type: layer_norm, dim: 4}]\n"
            "  - type: residual\n    modules: [{name: norm, type: layer_norm, dim: 4}]\n")
rc, text = run("run", dup)
check(rc == 2 and f"{dup}:5:" in text and "duplicate module name 'norm'" in text, f"duplicate through transparent residuals: {rc}: {text}")
check.finish()
