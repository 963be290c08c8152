#!/usr/bin/env python3
"""Golden files end to end, run by ctest.

    golden_cases.py PTOOL ROOT
Replays golden/ (exit 0; JUnit validated with xmllint against tests/data/junit.xsd); drift (one
tensor pushed past tolerance fails naming the tensor and the case); stale cases (edited text,
changed model file); bitwise reproducible records; damaged files (exit 2 naming the file); an
interrupted record (SIGTERM) leaves the old file intact and no temporary file; --update; a
golden recorded by PyTorch itself (tools/torch_golden.py) accepted by `verify --golden`, the pipeline
plans of tests/data/pipeline included (their reference and parallel run both held to torch's).
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from torch_model import read_safetensors, write_safetensors, ptool_hash  # noqa: E402
import json  # noqa: E402
from json_schema import validate_file  # noqa: E402
import struct  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()


def run(*args, **kw):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=300, **kw)
    return p.returncode, p.stdout + p.stderr


def metadata(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]).get("__metadata__", {})


def rewrite(src, dst, change_tensors=None, change_meta=None, drop=()):
    tensors = read_safetensors(src)
    meta = metadata(src)
    if change_tensors:
        change_tensors(tensors)
    if change_meta:
        change_meta(meta)
    write_safetensors(dst, [(k, v) for k, v in tensors.items() if k not in drop], meta)


with tempfile.TemporaryDirectory() as tmp:
    os.chdir(ROOT)
    # replay every shipped case, with JUnit that a CI system reads
    junit = os.path.join(tmp, "junit.xml")
    cases_json = os.path.join(tmp, "cases.json")
    rc, out = run("verify", "golden/", "--junit", junit, "-q", "--json", cases_json)
    check(rc == 0 and "0 failed, 0 stale" in out, f"golden/ replay: exit {rc}\n{out}")
    err = validate_file(cases_json, "golden_cases")  # every shipped case's document against docs/schema/
    check(err is None, f"golden/ replay --json: {err}")
    x = subprocess.run(["xmllint", "--noout", "--schema", "tests/data/junit.xsd", junit], capture_output=True, text=True)
    check(x.returncode == 0, f"JUnit does not validate: {x.stderr}")
    # golden/ holds a case for every shipped plan but these (docs/tour.md, Golden files)
    without = {"gemm_mlp_ddp": "benchmark-sized", "gemm_mlp_tp": "benchmark-sized",
               "mpy_bn_local": "fails by design (BatchNorm's local statistics under DDP): nothing to record"}
    # and for every pipeline plan of tests/data/pipeline, as pipeline_NAME (scripts/record_goldens.sh)
    plans = {os.path.basename(p)[:-5] for p in glob.glob("plans/*.yaml")}
    plans |= {"pipeline_" + os.path.basename(p)[:-5] for p in glob.glob("tests/data/pipeline/*.yaml")}
    plans |= {"float8_" + os.path.basename(p)[:-5] for p in glob.glob("tests/data/float8/*.yaml")}
    cases = {os.path.basename(p)[:-12] for p in glob.glob("golden/*.safetensors")}
    check(cases == plans - set(without), f"golden/ and plans/ differ: plans without a case {sorted(plans - cases - set(without))}, "
          f"cases without a plan {sorted(cases - plans)}, exceptions that have a case {sorted(cases & set(without))}")
    readme = open("docs/tour.md").read()
    check(all(f"`{name}`" in readme[readme.index("`golden/` holds a case"):][:600] for name in without),
          "docs/tour.md's golden/ sentence does not name every plan without a case")

    # drift: one tensor just past tolerance (2x the allowed error of its first element)
    case = os.path.join(tmp, "drift")
    os.mkdir(case)
    src = "golden/mlp_stacked_multi_wildcard.safetensors"

    def push(t):
        g = t["step0.grad.layers.1.net2.weight"]
        e = g.flatten()[0].item()
        g.view(-1)[0] = e + 2 * (1e-5 + 1.3e-6 * abs(e))
    rewrite(src, os.path.join(case, "drifted.safetensors"), change_tensors=push)
    rc, out = run("verify", case, "--junit", junit)
    check(rc == 1 and "drifted.safetensors: FAIL" in out and "step0.grad.layers.1.net2.weight" in out,
          f"drift not caught: exit {rc}\n{out}")
    # both runs are held to the golden: the parallel run's tensors are compared as it records them
    check("reference vs golden: step0.grad.layers.1.net2.weight" in out and
          "parallel vs golden: step0.grad.layers.1.net2.weight" in out, f"drift not caught in both directions:\n{out}")
    check("step0.grad.layers.1.net2.weight" in open(junit).read(), "JUnit failure names the tensor")

    # stale: the embedded text edited (hash no longer matches), and the recorded model file changed since
    stale = os.path.join(tmp, "stale")
    os.mkdir(stale)
    rewrite(src, os.path.join(stale, "edited.safetensors"),
            change_meta=lambda m: m.update(model_yaml=m["model_yaml"].replace("lr: 0.25", "lr: 0.5")))
    rc, out = run("verify", os.path.join(stale, "edited.safetensors"))
    check(rc == 1 and "STALE" in out and "does not match its hash" in out, f"edited text: exit {rc}\n{out}")
    model = os.path.join(tmp, "model.yaml")
    shutil.copy("models/mlp.yaml", model)
    rec = os.path.join(stale, "moved.safetensors")
    rc, out = run("golden", "record", model, "plans/mlp_root_module.yaml", "-o", rec)
    open(model, "a").write("# edited after recording\n")
    rc, out = run("verify", rec)
    check(rc == 1 and "STALE" in out and "changed since it was recorded" in out, f"changed model file: exit {rc}\n{out}")

    # bitwise reproducible records; refusing to overwrite without --force
    a, b = os.path.join(tmp, "a.safetensors"), os.path.join(tmp, "b.safetensors")
    run("golden", "record", "models/gpt_block.yaml", "plans/gpt_block_tp.yaml", "-o", a)
    run("golden", "record", "models/gpt_block.yaml", "plans/gpt_block_tp.yaml", "-o", b)
    check(open(a, "rb").read() == open(b, "rb").read(), "two records of the same case differ")
    rc, out = run("golden", "record", "models/gpt_block.yaml", "plans/gpt_block_tp.yaml", "-o", a)
    check(rc == 2 and "use --force" in out, f"overwrite without --force: exit {rc}\n{out}")
    rc, out = run("golden", "diff", a, b)
    check(rc == 0 and "0 of" in out, f"golden diff of identical files: exit {rc}\n{out}")

    # damaged files: exit 2 naming the file
    good = open(src, "rb").read()
    n = struct.unpack("<Q", good[:8])[0]
    damaged = {
        "truncated": good[:len(good) // 2],
        "lying_header": struct.pack("<Q", n + 1000) + good[8:],
        "wrong_dtype": good.replace(b'"F32"', b'"Q8"', 1),
    }
    for name, data in damaged.items():
        path = os.path.join(tmp, name + ".safetensors")
        open(path, "wb").write(data)
        rc, out = run("verify", path)
        check(rc == 2 and path in out, f"damaged {name}: exit {rc}\n{out}")
    missing = os.path.join(tmp, "missing.safetensors")
    rewrite(src, missing, drop=("step0.loss",))
    rc, out = run("verify", missing)
    check(rc == 2 and "step0.loss" in out, f"missing step0.loss: exit {rc}\n{out}")
    badkey = os.path.join(tmp, "badkey.safetensors")
    rewrite(src, badkey, change_tensors=lambda t: t.update({"stepX.loss": t["step0.loss"]}))
    rc, out = run("verify", badkey)
    check(rc == 2 and "stepX.loss" in out, f"malformed step key: exit {rc}\n{out}")
    broken = os.path.join(tmp, "broken.safetensors")
    rewrite(src, broken, change_meta=lambda m: m.update(model_yaml="modules: [", model_hash=ptool_hash("modules: [")))
    rc, out = run("verify", broken)
    check(rc == 2 and "broken.safetensors[model_yaml]:" in out, f"model text that does not parse: exit {rc}\n{out}")

    # an interrupted record: the old file stays whole, no temporary file is left
    target = os.path.join(tmp, "slow.safetensors")
    shutil.copy("golden/mlp_star.safetensors", target)
    before = open(target, "rb").read()
    for delay in (0.05, 0.3, 0.8):
        p = subprocess.Popen([PTOOL, "golden", "record", "models/gemm_mlp.yaml", "plans/gemm_mlp_tp.yaml", "-o", target,
                              "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
        now = open(target, "rb").read()
        complete = now == before or (p.returncode == 0 and len(now) > 8 and "model_yaml" in metadata(target))
        check(complete, f"SIGTERM after {delay}s left a partial {target}")
        check(not glob.glob(os.path.join(tmp, ".slow.safetensors.tmp-*")), f"SIGTERM after {delay}s left a temp file")
        if now != before:
            shutil.copy("golden/mlp_star.safetensors", target)
    # SIGKILL mid-write cannot be caught: the old file is still whole, and the temp file the killed
    # writer left is removed by the next write to the same path
    p = subprocess.Popen([PTOOL, "golden", "record", "models/gemm_mlp.yaml", "plans/gemm_mlp_tp.yaml", "-o", target,
                          "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    p.kill()
    p.wait(timeout=60)
    now = open(target, "rb").read()
    check(now == before or "model_yaml" in metadata(target), "SIGKILL left a partial golden file")
    stale = os.path.join(tmp, f".slow.safetensors.tmp-{p.pid}-abcdef")
    open(stale, "wb").write(b"partial")  # what a writer killed after creating its temp file leaves
    before_tmp, before_cwd = set(os.listdir(tmp)), set(os.listdir("."))
    rc, out = run("golden", "record", "models/mlp.yaml", "plans/mlp_root_module.yaml", "-o", target, "--force")
    check(rc == 0 and not glob.glob(os.path.join(tmp, ".slow.safetensors.tmp-*")),
          f"the next write did not remove a killed writer's temp file: exit {rc}\n{out}")
    # nothing written but the named file: the folder holds what it held (less the stale temp file)
    # (the killed writer's own temp file, if it got as far as creating one, is gone too)
    leftovers = {f for f in before_tmp if f.startswith(".slow.safetensors.tmp-")}
    check(set(os.listdir(tmp)) == before_tmp - leftovers and set(os.listdir(".")) == before_cwd,
          f"golden record wrote somewhere other than its output path: {set(os.listdir(tmp)) ^ before_tmp}, "
          f"{set(os.listdir('.')) ^ before_cwd}")

    # --update re-records a case whose numbers moved (model and plan unchanged), and says what moved
    upd = os.path.join(tmp, "update")
    os.mkdir(upd)
    rewrite(src, os.path.join(upd, "moved.safetensors"), change_tensors=push)
    rc, out = run("verify", upd, "--update")
    check(rc == 0 and "updated" in out and "moved: step0.grad.layers.1.net2.weight" in out, f"--update: exit {rc}\n{out}")
    rc, out = run("verify", upd)
    check(rc == 0 and "PASS" in out, f"after --update: exit {rc}\n{out}")

    # a golden recorded by PyTorch itself
    # (the training configurations: tied vocab-parallel head + loss_parallel + SP with dropout, RoPE/GQA
    # with AdamW defaults, accumulation and clipping under TP+SP, FSDP x TP with checkpointing, DDP x TP
    # in bf16 mixed precision, HSDP and HSDP x TP: HYBRID_SHARD's gradient is the average over the whole
    # data group, which is what PyTorch's one-device step computes for the mean loss; selective
    # activation checkpointing (op level, Megatron's core attention, every second layer) recomputes
    # the values the one-device step kept; context parallel: torch's one-device step over the whole
    # sequence is the oracle of the cp ranks' shards, as for every other dim; mixtures of experts:
    # transformers' routing per family, Mixtral's, Qwen2-MoE's with its gated shared expert, and
    # DeepSeek-V3's sigmoid router selecting by score + a drawn bias, Qwen3-MoE's with its per-head
    # q/k norms and heads wider than hidden / heads and an expert capacity (slots over it dropped in
    # the microbatch's token order, under DDP and under ep); expert parallel: the one-device step over
    # every expert is the oracle of the ep ranks' owned experts and their all_to_all dispatch)
    # (and the pipeline plans of tests/data/pipeline, each naming its model: torch's reference is the
    # one-device loop over the same G x microbatches microbatches, as torch.distributed.pipelining's
    # tests hold a pipeline to; the GPT-2 one's dropout masks drawn as for gpt2_tied_tp_sp)
    cases = [(f"models/{model}.yaml", f"plans/{plan}.yaml") for model, plan in (
        ("mlp", "mlp_root_module"), ("gpt_block", "gpt_block_tp"), ("gpt2_tied", "gpt2_tied_tp_sp"),
        ("gpt2_tied", "gpt2_tied_ddp_ac"), ("llama_rope", "llama_rope_tp_sp"),
        ("llama_rope", "llama_rope_tp_sp_megatron"),
        ("llama_rope", "llama_rope_fsdp_tp_ac"), ("llama_rope", "llama_rope_ddp_tp_bf16"),
        ("mlp_stacked_adamw", "mlp_stacked_hsdp"), ("mlp_stacked_adamw", "mlp_stacked_hsdp_tp"),
        ("hf_tiny_llama31", "hf_tiny_llama31_fsdp_tp_sac"), ("gpt2_tied", "gpt2_tied_ddp_core_attn"),
        ("llama_rope", "llama_rope_tp_sp_ac_every2"), ("llama_rope", "llama_rope_cp2"),
        ("llama_rope", "llama_rope_cp4"), ("llama_rope", "llama_rope_fsdp_cp"), ("llama_rope", "llama_rope_cp_tp"),
        ("llama_rope_long", "llama_rope_long_fsdp_cp"), ("llama_rope", "llama_rope_ring_cp4"),
        ("llama_rope_long", "llama_rope_long_ring_fsdp_cp"), ("moe_mixtral", "moe_mixtral_ddp"),
        ("moe_qwen2", "moe_qwen2_fsdp"), ("moe_deepseek", "moe_mixtral_ddp"), ("moe_qwen3", "moe_mixtral_ddp"), ("moe_mixtral", "moe_mixtral_tp_experts"),
        ("moe_mixtral", "moe_mixtral_ep"), ("moe_mixtral", "moe_mixtral_ep_tp"), ("moe_qwen2", "moe_qwen2_ep_hsdp"),
        ("moe_mixtral", "moe_mixtral_ep_fsdp"),
        ("moe_qwen3", "moe_mixtral_ep"), ("llama_sft", "llama_sft_ddp"), ("llama_sft", "llama_sft_fsdp_cp"),
        ("llama_sft", "llama_sft_ring_cp_tp_lp"), ("moe_mixtral_sft", "moe_mixtral_sft_ep"),
        ("encoder_mlm", "encoder_mlm_ring_cp2_ddp"))]
    pipelines = sorted(glob.glob("tests/data/pipeline/*.yaml"))
    check(len(pipelines) >= 4, f"tests/data/pipeline has {len(pipelines)} plans")
    cases += [(re.search(r"(tests/data/)?models/[a-z_0-9]+\.yaml", open(p).read()).group(0), p) for p in pipelines]
    # the float8 plans against tools/torch_float8.py's Float8Linear (the formats' rounding written out)
    cases += [(re.search(r"models/[a-z_0-9]+\.yaml", open(p).read()).group(0), p)
              for p in sorted(glob.glob("tests/data/float8/*.yaml"))]
    if os.environ.get("PTOOL_SANITIZER"):  # numerics against PyTorch are the plain build's job; under a
        cases = cases[:3]                  # sanitizer a few cases cover --golden's code (CI time)
    for model, plan in cases:
        tg = os.path.join(tmp, f"torch_{os.path.basename(plan)[:-5]}.safetensors")
        p = subprocess.run([sys.executable, "tools/torch_golden.py", model, plan, "-o", tg],
                           capture_output=True, text=True, timeout=300)
        rc, out = run("verify", model, plan, "--golden", tg)
        check(p.returncode == 0 and rc == 0 and "reference vs golden: PASS" in out and "parallel vs golden: PASS" in out,
              f"torch golden {model} x {plan}: exit {rc}\n{p.stderr}{out}")
    # the microbatches matter where the loss is a sum (each microbatch's divided by their count): a
    # pipeline of models/mlp_stacked.yaml passes against torch's loop over them, and fails against
    # torch's one-microbatch step (recorded without pipeline_parallel, the plan's text put back)
    sum_plan, whole = os.path.join(tmp, "mlp_sum_pp2.yaml"), os.path.join(tmp, "mlp_sum_whole.yaml")
    open(sum_plan, "w").write("# models/mlp_stacked.yaml (loss: sum) in two 1F1B stages\n"
                              "mesh: {pp: 2}\npipeline_parallel: {microbatches: 4}\n")
    open(whole, "w").write("mesh: {pp: 2}\n")
    for plan, expect in ((sum_plan, "PASS"), (whole, "FAIL")):
        tg = os.path.join(tmp, f"torch_{os.path.basename(plan)[:-5]}.safetensors")
        p = subprocess.run([sys.executable, "tools/torch_golden.py", "models/mlp_stacked.yaml", plan, "-o", tg],
                           capture_output=True, text=True, timeout=300)
        check(p.returncode == 0, f"torch_golden.py {plan}: exit {p.returncode}\n{p.stderr}")
        text = open(sum_plan).read()
        rewrite(tg, tg, change_meta=lambda m: m.update(plan_yaml=text, plan_hash=ptool_hash(text), plan_path=sum_plan))
        rc, out = run("verify", "models/mlp_stacked.yaml", sum_plan, "--golden", tg)
        check(rc == (0 if expect == "PASS" else 1) and "parallel vs reference: PASS" in out
              and f"reference vs golden: {expect}" in out and f"parallel vs golden: {expect}" in out
              and (expect == "PASS" or re.search(r"reference vs golden: step\d\.(loss|grad\.)", out)),
              f"torch golden of {plan} against {sum_plan}: exit {rc}, expected {expect}\n{out[-1500:]}")

    # masked targets: a plan that normalises per call while the ranks hold different counts of valid
    # targets fails, and its cause (the counts, the fix) prints in every mode: verify -q, a golden
    # replay, --golden; PyTorch's loop under the other normalisation is no oracle for it
    per_call = os.path.join(tmp, "llama_sft_per_call.yaml")
    open(per_call, "w").write("# models/llama_sft.yaml per call\nmesh: {dp: 2}\n"
                              "data_parallel: {mesh_dim: dp, mode: replicate}\nloss_normalization: mean_per_call\n")
    g = os.path.join(tmp, "per_call.safetensors")
    rc, out = run("golden", "record", "models/llama_sft.yaml", per_call, "-o", g)
    check(rc == 0, f"golden record of a per-call plan: {rc}\n{out}")
    for what, args in (("verify -q", ("verify", "models/llama_sft.yaml", per_call, "-q")),
                       ("verify GOLDEN", ("verify", g, "-q")),
                       ("verify --golden", ("verify", "models/llama_sft.yaml", per_call, "--golden", g, "-q"))):
        rc, out = run(*args)
        check(rc == 1 and re.search(r"cause: .*mean_per_call with targets masked unevenly: step 0's microbatch \d+ holds "
                                    r"\d+, \d+ valid targets on data ranks 0-1.*loss_normalization: global_tokens", out),
              f"{what} of a per-call plan on masked targets: exit 1 with the cause expected, got {rc}\n{out[-2000:]}")
    tg = os.path.join(tmp, "torch_llama_sft_per_call.safetensors")
    p = subprocess.run([sys.executable, "tools/torch_golden.py", "models/llama_sft.yaml", per_call, "-o", tg],
                       capture_output=True, text=True, timeout=300)
    rc, out = run("verify", "models/llama_sft.yaml", "plans/llama_sft_ddp.yaml", "--golden", tg, "-q")
    check(p.returncode == 0 and rc == 1 and "reference vs golden: FAIL" in out,
          f"torch's per-call loop against llama_sft's global_tokens: reference vs golden FAIL expected, got {rc}\n{out[-1500:]}")
    # a step whose batch has no valid target: nothing to train on, exit 2 at the mask
    empty = os.path.join(tmp, "all_masked.yaml")
    open(empty, "w").write(open("models/llama_sft.yaml").read().replace("{prompt: [2, 9], padding: [0, 5]}", "{prompt: 16}"))
    rc, out = run("verify", empty, "plans/llama_sft_ddp.yaml")
    check(rc == 2 and f"{empty}:14:19" in out and "no valid target" in out, f"an all-masked batch: exit 2 at the mask expected, got {rc}\n{out}")

check.finish()
