#!/usr/bin/env python3
"""ZeRO-1 and ZeRO-2 under replicate() (data_parallel's zero_stage; parallel/zero_optimizer.h).

    zero_cases.py PTOOL ROOT

1. The shipped plans verify PASS (plans/mlp_stacked_zero1.yaml: dp 4; plans/llama_rope_zero2_tp_bf16.yaml:
   dp 2 x tp 2, bf16 mixed precision, clip_grad_norm, 2 microbatches), and so do ZeRO-2 over DDP x TP in
   float32 (mlp_stacked_adamw) and ZeRO-1 with SGD (mlp_stacked_mse); their goldens replay.
2. The same numbers as DDP: without clipping, the shards' update is elementwise what DDP's is, so every
   tensor's error against the reference is the DDP plan's, to the bit (max abs and max rel of every tensor).
3. explain: its predicted peak per rank is verify's measured one to the byte, its derived collectives per
   step are the measured ones (calls and bytes per op), the optimizer's state at the peak is 1/dp of DDP's
   (to the padding of the last shard), and ZeRO-2's resident memory (before the first step) is below
   ZeRO-1's (no persistent DDP bucket).
4. Faults: zero_skip_gather, zero_wrong_group and zero_wrong_offset, and DDP's grad_sum, each fails
   verify (exit 1) on both shipped plans and is localised (the step-0 update or gradient the report names).
5. Bad values of the key exit 2 at the plan's key (file:line:column): 3, -1, a string, mode fully_shard,
   fully_shard units, stage 2 with gradient_as_bucket_view, a pipeline.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()
M = lambda n: f"{ROOT}/models/{n}.yaml"  # noqa: E731
P = lambda n: f"{ROOT}/plans/{n}.yaml"  # noqa: E731
SHIPPED = [(M("mlp_stacked_adamw"), P("mlp_stacked_zero1")), (M("llama_rope"), P("llama_rope_zero2_tp_bf16"))]


def run(*args, env=None, timeout=300):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def verify_json(model, plan, tmp, *extra, env=None):
    out = os.path.join(tmp, "v.json")
    if os.path.exists(out):
        os.remove(out)
    rc, text = run("verify", model, plan, "--json", out, "-q", *extra, env=env)
    return rc, text, (json.load(open(out))["plans"][0] if os.path.exists(out) else None)


def explain_json(model, plan, tmp):
    out = os.path.join(tmp, "e.json")
    rc, text = run("explain", model, plan, "--json", out)
    check(rc == 0, f"explain {plan}: exit {rc}\n{text[-1500:]}")
    return json.load(open(out)) if rc == 0 else None


def write(tmp, name, text):
    path = os.path.join(tmp, name)
    open(path, "w").write(text)
    return path


def collectives(ops):
    out = {}
    for op, calls, b in ops:
        out.setdefault(op, [0, 0])
        out[op][0] += calls
        out[op][1] += b
    return out


with tempfile.TemporaryDirectory() as tmp:
    dp2tp2 = open(P("mlp_stacked_dp2_tp2")).read()
    extra = [(M("mlp_stacked_adamw"), write(tmp, "mlp_zero2_tp.yaml", dp2tp2 + "  zero_stage: 2\n  bucket_cap_mb: 0.0005\n")),
             (M("mlp_stacked_mse"), P("mlp_stacked_zero1"))]
    # 1. PASS
    for model, plan in SHIPPED + extra:
        rc, text, rep = verify_json(model, plan, tmp)
        check(rc == 0 and rep and rep["pass"], f"verify {model} {plan}: exit {rc}\n{text[-2000:]}")
    for model, plan in SHIPPED:
        g = f"{ROOT}/golden/{os.path.basename(plan)[:-5]}.safetensors"
        rc, text = run("verify", g, "-q")
        check(rc == 0 and "PASS" in text, f"golden {g}: exit {rc}\n{text[-1500:]}")

    # 2. ZeRO's numbers are DDP's (no clipping: mlp_stacked_adamw, stage 1 on dp 4 and stage 2 on dp 2 x tp 2)
    zero1 = open(P("mlp_stacked_zero1")).read()
    ddp4 = write(tmp, "ddp4.yaml", zero1.replace("  zero_stage: 1\n", ""))
    ddp_tp = write(tmp, "ddp_tp.yaml", dp2tp2 + "  bucket_cap_mb: 0.0005\n")
    for zero, ddp in ((P("mlp_stacked_zero1"), ddp4), (extra[0][1], ddp_tp)):
        _, _, a = verify_json(M("mlp_stacked_adamw"), zero, tmp)
        _, _, b = verify_json(M("mlp_stacked_adamw"), ddp, tmp)
        ea = {t["name"]: (t["max_abs"], t["max_rel"]) for t in a["tensors"]} if a else {}
        eb = {t["name"]: (t["max_abs"], t["max_rel"]) for t in b["tensors"]} if b else {}
        check(ea and ea == eb, f"{zero} against the reference is not DDP's to the bit:\n"
              + "\n".join(f"  {k}: {ea.get(k)} vs {eb.get(k)}" for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)))

    # 3. explain: peak = measured, collectives = measured, the optimizer's state 1/dp of DDP's
    for model, plan in SHIPPED + extra[:1]:
        e = explain_json(model, plan, tmp)
        rc, text, rep = verify_json(model, plan, tmp)
        if not e or not rep:
            continue
        check(e["zero_stage"] in (1, 2), f"{plan}: explain's zero_stage {e['zero_stage']}")
        key = "first_step_peak_bytes" if e["verify_steps"] == 1 else "predicted_peak_bytes"
        pred = {r: m[key] for m in e["memory"] for r in m["ranks"]}
        meas = {m["rank"]: m["measured_peak_bytes"] for m in rep["memory"]}
        check(pred == meas, f"{plan}: explain's peaks {pred} != measured {meas}")
        derived = collectives((c["op"], 1, c["bytes"]) for c in e["collectives_per_step"])
        _, _, one = verify_json(model, plan, tmp, "--steps", "1")
        measured = collectives((c["op"], c["calls"], c["bytes"]) for c in one["collectives"]["steps"]) if one else {}
        check(derived == measured and "all_gather" in derived, f"{plan}: derived {derived} != measured {measured}")
        base = write(tmp, "base.yaml", re.sub(r"  zero_stage: \d\n", "", open(plan).read()))
        d = explain_json(model, base, tmp)
        n = e["dp"]
        z_opt, d_opt = e["memory"][0]["at_peak"]["optimizer"], d["memory"][0]["at_peak"]["optimizer"]
        check(d_opt > 0 and d_opt / n <= z_opt <= d_opt / n + 2 * 4 * n * 64,
              f"{plan}: optimizer state {z_opt} at the peak, DDP's {d_opt} over {n} dp ranks")
        if e["zero_stage"] == 2:
            z1 = explain_json(model, write(tmp, "z1.yaml", open(plan).read().replace("zero_stage: 2", "zero_stage: 1")), tmp)
            check(e["memory"][0]["resident_bytes"] < z1["memory"][0]["resident_bytes"],
                  f"{plan}: ZeRO-2's resident {e['memory'][0]['resident_bytes']} is not below ZeRO-1's "
                  f"{z1['memory'][0]['resident_bytes']}")

    # 4. faults: detected (exit 1) and localised
    def update_fails(r):
        return "step 0 update of" in r["localisation"] or any(
            t["name"].startswith("step0.param.") and not t["pass"] for t in r["tensors"])

    def grad_fails(r):
        return "step 0 gradient" in r["localisation"] or any(
            t["name"].startswith("step0.grad") and not t["pass"] for t in r["tensors"])

    for fault, localised in (("zero_skip_gather:*", update_fails), ("zero_wrong_offset:*", update_fails),
                             ("zero_wrong_group:*", grad_fails), ("grad_sum:*", grad_fails)):
        for model, plan in SHIPPED:
            rc, text, rep = verify_json(model, plan, tmp, env={"PTOOL_FAULT": fault})
            check(rc == 1 and rep and not rep["pass"] and localised(rep),
                  f"PTOOL_FAULT={fault} {plan}: exit {rc}, not caught or not localised\n{text[-1500:]}")

    # 5. bad values exit 2 at the key
    base = "mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n"
    bad = [("  mode: replicate\n  zero_stage: 3\n", "must be 0"), ("  zero_stage: -1\n", "must be 0"),
           ("  zero_stage: one\n", "zero_stage"),
           ("  mode: fully_shard\n  zero_stage: 1\n", "needs mode replicate"),
           ("  fully_shard: [layers.0]\n  zero_stage: 1\n", "fully_shard units"),
           ("  gradient_as_bucket_view: true\n  zero_stage: 2\n", "gradient_as_bucket_view")]
    for body, words in bad:
        path = write(tmp, "bad.yaml", base + body)
        line = base.count("\n") + body.count("\n")  # the key is the last line
        for cmd in ("verify", "explain"):
            rc, text = run(cmd, M("mlp_stacked_adamw"), path)
            check(rc == 2 and re.search(rf"bad\.yaml:{line}:\d+:.*{re.escape(words)}", text),
                  f"{cmd} with {body.strip()!r}: exit {rc}, expected 2 at bad.yaml:{line}\n{text[-800:]}")
    pipe = write(tmp, "bad.yaml", "mesh: {pp: 2, dp: 2}\npipeline_parallel: {mesh_dim: pp}\n"
                 "data_parallel: {mesh_dim: dp, zero_stage: 1}\n")
    rc, text = run("verify", M("mlp_stacked_adamw"), pipe)
    check(rc == 2 and re.search(r"bad\.yaml:3:\d+:.*pipeline", text), f"ZeRO with a pipeline: exit {rc}\n{text[-800:]}")

check.finish()
