#!/usr/bin/env python3
"""A plan carries its training layout: its top-level `gradient_accumulation` overrides the model's
(docs/plan_format.md).

    plan_layout.py PTOOL ROOT

1. The same numbers as the model edited to say it (and one verify of a plan with the key and one
   without runs a reference for each): for each case (DDP x TP, SyncBatchNorm under
   DDP, whose statistics follow the microbatches, a pipeline's rounds over DDP, and llama_rope,
   whose model says 2, overridden down to 1 and up to 4), MODEL with PLAN + `gradient_accumulation:
   N` and MODEL edited to `gradient_accumulation: N` with PLAN as shipped: verify PASS both, with
   the same collectives per step; `golden record` of each holds bitwise the same tensors (losses,
   outputs, gradients, parameters, buffers of every step: the reference runs the plan's
   microbatches); explain's predicted memory per rank, collectives and record size are the same
   (and its JSON says whose value applied); the plan's proxy (`ptool shrink`) says the plan's value
   and verifies. The unedited model with the plan as shipped gives other tensors, so each
   comparison could fail.
2. Bad values exit 2 at the plan's key (file:line:column) for verify, explain, golden record and
   shrink: not a positive integer, over the limit, not dividing the rows, a microbatch not
   splitting over the dp ranks, a pipeline's rounds x microbatches not cutting the rows or not
   splitting; and gradient_accumulation inside pipeline_parallel (one meaning: the top-level key).
3. Goldens: a golden recorded with a plan that carries the key replays PASS: bitwise (--rtol 0
   --atol 0) for a pipeline of 2 pp ranks, at its tolerance under SyncBatchNorm, where the same plan
   without the key records other tensors (so the replay's reference applied the key); PyTorch's
   numbers (tools/torch_golden.py, which reads the plan's key) for SyncBatchNorm with the plan's 2
   microbatches pass `verify --golden`, and the plan without the key (the model's 1) fails it.
4. The issue's reproduction: `ptool import hf` of Llama 3.1 8B at 32 x 8192 tokens, `ptool plan -o`
   on 8 H100s: the plan it writes carries `gradient_accumulation` (the best candidate needs 8
   microbatches), and `ptool explain` of the unedited model with it reports the planned peak and
   step (within 1%; measured equal), and `plan --verify` passes on a proxy of the unedited model;
   without the key explain's peak is over the GPU.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402
from json_schema import validate_file  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
TORCH_PYTHON = "/usr/bin/python3"  # Debian's torch (tools/torch_golden.py)
check = Checks()


def run(*args, timeout=300):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def tensors(path):
    """A safetensors file's tensors: name -> (dtype, shape, raw bytes)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def with_key(text, n):
    return text.rstrip("\n") + f"\ngradient_accumulation: {n}\n"


def model_saying(text, n):
    """The model's text with `gradient_accumulation: n` (its own line replaced, or added)."""
    if re.search(r"^gradient_accumulation:", text, re.M):
        return re.sub(r"^gradient_accumulation: *\d+", f"gradient_accumulation: {n}", text, flags=re.M)
    return text.rstrip("\n") + f"\ngradient_accumulation: {n}\n"


def explained(model, plan, tmp):
    out = os.path.join(tmp, "e.json")
    rc, text = run("explain", model, plan, "--json", out)
    if not check(rc == 0, f"explain {model} {plan}: exit {rc}\n{text[-2000:]}"):
        return None
    err = validate_file(out, "explain")
    check(err is None, f"explain {plan}: {err}")
    return json.load(open(out))


with tempfile.TemporaryDirectory() as tmp:
    # 1. the plan's key, the model's edit: the same numbers
    CASES = [  # (model, plan, N)
        ("models/mlp_stacked_adamw.yaml", "plans/mlp_stacked_dp2_tp2.yaml", 4),
        ("models/mpy.yaml", "plans/mpy_sync_bn.yaml", 2),
        ("models/mlp_stacked_mse.yaml", "tests/data/pipeline/mlp_pp2_ddp_layers.yaml", 2),
        ("models/llama_rope.yaml", "plans/llama_rope_tp_sp.yaml", 1),
        ("models/llama_rope.yaml", "plans/llama_rope_tp_sp.yaml", 4),
    ]
    for model_rel, plan_rel, n in CASES:
        what = f"{os.path.basename(plan_rel)} with gradient_accumulation {n}"
        model, plan = f"{ROOT}/{model_rel}", f"{ROOT}/{plan_rel}"
        plan_key, model_edit = os.path.join(tmp, "plan_key.yaml"), os.path.join(tmp, "model_edit.yaml")
        open(plan_key, "w").write(with_key(open(plan).read(), n))
        open(model_edit, "w").write(model_saying(open(model).read(), n))
        m = re.search(r"^gradient_accumulation: *(\d+)", open(model).read(), re.M)
        check((int(m.group(1)) if m else 1) != n, f"{what}: the model already says {n}")
        runs = {}
        for side, (mm, pp) in {"plan": (model, plan_key), "model": (model_edit, plan)}.items():
            rc, out = run("verify", mm, pp, "-q")
            check(rc == 0 and "PASS" in out, f"{what}: verify ({side}'s) exit {rc}\n{out[-2000:]}")
            comm = re.search(r"collectives per step: ([^;\n]*)", out)
            runs[side] = comm and comm.group(1)
        check(runs["plan"] is not None and runs["plan"] == runs["model"],
              f"{what}: collectives per step {runs['plan']!r} (the plan's key), {runs['model']!r} (the model's)")
        goldens = {}
        for side, (mm, pp) in {"plan": (model, plan_key), "model": (model_edit, plan), "neither": (model, plan)}.items():
            g = os.path.join(tmp, f"{side}.safetensors")
            rc, out = run("golden", "record", mm, pp, "-o", g, "--force")
            if check(rc == 0, f"{what}: golden record ({side}) exit {rc}\n{out[-2000:]}"):
                goldens[side] = tensors(g)
        if len(goldens) == 3:
            a, b, c = goldens["plan"], goldens["model"], goldens["neither"]
            differ = [k for k in a if a[k] != b.get(k)]
            check(set(a) == set(b) and not differ and len(a) > 10,
                  f"{what}: the plan's key and the model's edit record different tensors: {differ[:5]} "
                  f"(names only on one side: {sorted(set(a) ^ set(b))[:5]})")
            moved = [k for k in a if a[k] != c.get(k)]
            check(moved, f"{what}: the plan without the key records the same tensors: the comparison could not fail")
        ea, eb = explained(model, plan_key, tmp), explained(model_edit, plan, tmp)
        if ea and eb:
            for key in ("memory", "collectives_per_step", "verify_record_bytes_per_step", "gradient_accumulation"):
                check(ea[key] == eb[key], f"{what}: explain's {key} differs:\n  the plan's key: {str(ea[key])[:600]}\n"
                      f"  the model's:    {str(eb[key])[:600]}")
            check(ea["gradient_accumulation"] == n and ea["gradient_accumulation_from"] == "plan"
                  and eb["gradient_accumulation_from"] == "model",
                  f"{what}: explain says {ea['gradient_accumulation']} from {ea['gradient_accumulation_from']}, "
                  f"{eb['gradient_accumulation']} from {eb['gradient_accumulation_from']}")
            rc, out = run("explain", model, plan_key)
            check(f"gradient_accumulation {n} (the plan's; the model says" in out.splitlines()[0],
                  f"{what}: explain's first line does not say whose\n{out[:400]}")
        # the plan's proxy (ptool shrink): rows for the plan's microbatches, which it says too; it verifies
        proxy = os.path.join(tmp, "proxy.yaml")
        rc, out = run("shrink", model, plan_key, "-o", proxy)
        if check(rc == 0, f"{what}: shrink exit {rc}\n{out[-1500:]}"):
            check(f"\ngradient_accumulation: {n}\n" in open(proxy).read(), f"{what}: the proxy:\n{open(proxy).read()}")
            rc, out = run("verify", proxy, plan_key, "-q")
            check(rc == 0 and "PASS" in out, f"{what}: verify of the proxy: exit {rc}\n{out[-1500:]}")
    print(f"{len(CASES)} plans with gradient_accumulation: the numbers of the model edited to say it")
    # one verify of the plan with and without the key: each against its own reference (SyncBatchNorm's
    # statistics are the microbatches': a reference shared between them would fail one)
    plan_key = os.path.join(tmp, "mpy_sync_bn_ga2.yaml")
    open(plan_key, "w").write(with_key(open(f"{ROOT}/plans/mpy_sync_bn.yaml").read(), 2))
    rc, out = run("verify", f"{ROOT}/models/mpy.yaml", f"{ROOT}/plans/mpy_sync_bn.yaml", plan_key, "-q")
    check(rc == 0 and out.count(": PASS") == 2, f"one verify of mpy_sync_bn with and without the key: exit {rc}\n{out[-2000:]}")

    # 2. bad values: exit 2 at the plan's key, whichever command reads it
    dp2 = open(f"{ROOT}/plans/mlp_stacked_dp2_tp2.yaml").read().rstrip("\n") + "\n"
    pipe = open(f"{ROOT}/tests/data/pipeline/mlp_pp2_ddp_layers.yaml").read().rstrip("\n") + "\n"
    mlp16 = f"{ROOT}/models/mlp_stacked_adamw.yaml"  # 16 rows
    mse16 = f"{ROOT}/models/mlp_stacked_mse.yaml"  # 16 rows
    BAD = [  # (model, plan text, value, message); the key is the plan's last line
        (mlp16, dp2, "0", "'gradient_accumulation' must be positive, got 0"),
        (mlp16, dp2, "-2", "'gradient_accumulation' must be positive, got -2"),
        (mlp16, dp2, "two", "'gradient_accumulation' must be an integer, got 'two'"),
        (mlp16, dp2, "2.0", "'gradient_accumulation' must be an integer, got '2.0'"),
        (mlp16, dp2, "65537", "gradient_accumulation 65537 is over the limit of 65536"),
        (mlp16, dp2, "3", "gradient_accumulation 3 does not divide the batch's 16 rows into equal microbatches"),
        (mlp16, dp2, "16", "each of the 16 microbatches of 1 row (the plan's gradient_accumulation) does not split "
                           "evenly over the 2 data ranks"),
        # microbatches: 4 over dp 2: 8 rounds cut 16 rows into 32; 4 rounds into 16 of 1 row, on 2 data ranks
        (mse16, pipe, "8", "the batch's 16 rows do not cut into 32 microbatches (8 rounds of gradient_accumulation x 4)"),
        (mse16, pipe, "4", "each of the 16 microbatches (4 rounds of gradient_accumulation x 4) of 1 rows does not "
                           "split evenly over the 2 data ranks"),
    ]
    for model, base, value, message in BAD:
        text = base + f"gradient_accumulation: {value}\n"
        plan = os.path.join(tmp, "bad.yaml")
        open(plan, "w").write(text)
        at = f"{plan}:{text.count(chr(10))}:24: {message}"  # the value of the last line's key
        for cmd in (["verify", model, plan, "-q"], ["explain", model, plan],
                    ["golden", "record", model, plan, "-o", os.path.join(tmp, "bad.safetensors"), "--force"],
                    ["shrink", model, plan]):
            rc, out = run(*cmd)
            check(rc == 2 and at in out, f"{cmd[0]} with gradient_accumulation {value}: exit {rc}, want 2 and\n  {at}\n{out[-1500:]}")
        check(not os.path.exists(os.path.join(tmp, "bad.safetensors")), f"gradient_accumulation {value}: a golden was written")
    # inside pipeline_parallel: one meaning, at the top level
    text = pipe.replace("microbatches: 4}", "microbatches: 4, gradient_accumulation: 2}")
    check(text != pipe, "the pipeline plan's microbatches moved: the nested-key case tests nothing")
    plan = os.path.join(tmp, "nested.yaml")
    open(plan, "w").write(text)
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "gradient_accumulation" in l)
    col = text.splitlines()[line - 1].index("gradient_accumulation: 2") + len("gradient_accumulation: ") + 1
    rc, out = run("verify", mse16, plan, "-q")
    check(rc == 2 and f"{plan}:{line}:{col}: gradient_accumulation is a top-level key of the plan" in out,
          f"gradient_accumulation inside pipeline_parallel: exit {rc}\n{out[-1500:]}")
    # twice at the top level: the YAML reader's duplicate key
    open(plan, "w").write(dp2 + "gradient_accumulation: 2\ngradient_accumulation: 4\n")
    rc, out = run("explain", mlp16, plan)
    check(rc == 2 and "duplicate key 'gradient_accumulation'" in out, f"a duplicate key: exit {rc}\n{out[-800:]}")

    # 3. goldens carry the plan, and replay applies its key: bitwise on a pipeline of 2 pp ranks
    # (whose tensors are the reference's bitwise), where the same plan without the key records
    # other tensors; under SyncBatchNorm at the golden's tolerance, where the microbatches are the
    # statistics
    pp_only = "# models/mlp_stacked_mse.yaml\nmesh: {pp: 2}\npipeline_parallel: {layers_per_stage: 1, microbatches: 2}\n"
    for model, plan_text, flags in ((mse16, with_key(pp_only, 4), ["--rtol", "0", "--atol", "0"]),
                                    (f"{ROOT}/models/mpy.yaml", with_key(open(f"{ROOT}/plans/mpy_sync_bn.yaml").read(), 2), [])):
        plan, g, g0 = os.path.join(tmp, "golden_plan.yaml"), os.path.join(tmp, "g.safetensors"), os.path.join(tmp, "g0.safetensors")
        open(plan, "w").write(plan_text)
        rc, out = run("golden", "record", model, plan, "-o", g, "--force")
        check(rc == 0, f"golden record of a plan with the key: exit {rc}\n{out}")
        rc, out = run("verify", g, *flags)
        check(rc == 0 and "1 passed" in out, f"its replay {flags}: exit {rc}\n{out[-2000:]}")
        open(plan, "w").write(re.sub(r"^gradient_accumulation: \d+\n", "", plan_text, flags=re.M))
        rc, out = run("golden", "record", model, plan, "-o", g0, "--force")
        if check(rc == 0, f"golden record without the key: exit {rc}\n{out}"):
            a, b = tensors(g), tensors(g0)
            check(any(a[k] != b.get(k) for k in a), f"{model}: the key changes no recorded tensor: the replay proves nothing")
    model, plan = f"{ROOT}/models/mpy.yaml", os.path.join(tmp, "mpy_ga2.yaml")
    open(plan, "w").write(with_key(open(f"{ROOT}/plans/mpy_sync_bn.yaml").read(), 2))
    # PyTorch's numbers, G read from the plan (SyncBatchNorm's statistics are each microbatch's)
    t = os.path.join(tmp, "torch.safetensors")
    p = subprocess.run([TORCH_PYTHON, f"{ROOT}/tools/torch_golden.py", model, plan, "-o", t],
                       capture_output=True, text=True, timeout=300)
    if check(p.returncode == 0, f"torch_golden.py with the plan's key: exit {p.returncode}\n{p.stderr[-2000:]}"):
        rc, out = run("verify", model, plan, "--golden", t, "-q")
        check(rc == 0 and "PASS" in out, f"ptool with the plan's key against PyTorch's: exit {rc}\n{out[-2000:]}")
        rc, out = run("verify", model, f"{ROOT}/plans/mpy_sync_bn.yaml", "--golden", t, "-q")
        check(rc == 1, f"the model's 1 microbatch against PyTorch's 2: exit {rc}, want 1 (a mismatch)\n{out[-1500:]}")

    # 4. the issue: an imported Llama at its global batch, planned, explained as written
    cluster = f"{ROOT}/clusters/h100_8x8.yaml"
    llama, written = os.path.join(tmp, "llama31_8b.yaml"), os.path.join(tmp, "llama31_8b_plan.yaml")
    rc, out = run("import", "hf", f"{ROOT}/tests/data/hf/llama-3.1-8b.json", "--batch", "32", "--seq", "8192", "-o", llama)
    check(rc == 0, f"import hf: exit {rc}\n{out}")
    pj = os.path.join(tmp, "plan.json")
    rc, out = run("plan", llama, "--cluster", cluster, "--world-size", "8", "-o", written, "--json", pj)
    if check(rc == 0, f"plan of the imported Llama: exit {rc}\n{out}"):
        best = json.load(open(pj))["candidates"][0]
        text = open(written).read()
        check(best["microbatches"] > 1 and f"\ngradient_accumulation: {best['microbatches']}\n" in text
              and f"gradient_accumulation: {best['microbatches']}\n" in best["plan"]
              and "Needs `gradient_accumulation" not in text,
              f"the best plan needs {best['microbatches']} microbatches; the plan written:\n{text[:1500]}")
        check("gradient_accumulation" not in open(llama).read(), "the imported model says gradient_accumulation")
        e = os.path.join(tmp, "e.json")
        rc, out = run("explain", llama, written, "--cluster", cluster, "--json", e)
        if check(rc == 0, f"explain of the written plan: exit {rc}\n{out[-2000:]}"):
            ej = json.load(open(e))
            peak = max(m["allocated_peak_bytes"] for m in ej["memory"])
            planned = best["peak_bytes"]
            step = ej["time"][0]["step_seconds"]
            check(abs(planned - peak) <= 0.01 * peak and abs(best["step_seconds"] - step) <= 0.01 * step,
                  f"planned peak {planned:.0f} B, step {best['step_seconds']} s; explain's {peak} B, {step} s")
            print(f"imported Llama 3.1 8B, 32 x 8192 tokens on 8 H100s: planned {best['microbatches']} microbatches, "
                  f"peak {planned / 2**30:.2f} GiB, step {best['step_seconds']:.3f} s; explain of the written plan "
                  f"{peak / 2**30:.2f} GiB, {step:.3f} s")
        # plan --verify: the best plan on a proxy of the model as written, the plan's microbatches
        rc, out = run("plan", llama, "--cluster", cluster, "--world-size", "8", "--verify")
        check(rc == 0 and "verifying the best plan on a proxy" in out and ": PASS" in out,
              f"plan --verify of the imported Llama: exit {rc}\n{out[-2000:]}")
        # the same plan without its key (what explain read before plans carried it): not the plan
        stripped = os.path.join(tmp, "stripped.yaml")
        open(stripped, "w").write(re.sub(r"^gradient_accumulation: \d+\n", "", text, flags=re.M))
        rc, out = run("explain", llama, stripped, "--json", e)
        if check(rc == 0, f"explain without the key: exit {rc}\n{out[-1500:]}"):
            peak1 = max(m["predicted_peak_bytes"] for m in json.load(open(e))["memory"])
            check(peak1 > 80 * 2**30, f"without the key explain's peak is {peak1 / 2**30:.1f} GiB: the key changes nothing")
check.finish()
