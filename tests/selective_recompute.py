#!/usr/bin/env python3
"""Selective activation checkpointing (docs/plan_format.md, activation_checkpointing's modes).

    selective_recompute.py PTOOL ROOT

1. torchtitan's op-level policy on a chain of five linears (a, b, c with its bias, d, e): the
   recompute runs b, c and e (every other aten.mm kept: a and d; c is addmm, neither counted nor
   kept), so explain's recompute FLOPs are 3 x 2 rows in out, full checkpointing's 5 x, none 0;
   every mode verifies PASS.
2. Megatron's core_attn on GPT-2's eager attention: each attention recomputes q k^T in backward
   (2 B H T^2 hd FLOPs) and no longer holds its probabilities (B H T^2 x 4 bytes less at the peak);
   `every: 2` does it for one block of two.
3. The op policy on a Llama (flash attention): full minus op recompute is exactly what the policy
   keeps: q_proj, v_proj, gate_proj, down_proj and SDPA's forward (q k^T and p v).
4. `every`: which modules explain names checkpointed, torchtitan's counting.
5. A fault in what the policy keeps (sac_stale_output) fails verify, localised to the region's
   backward; the same plan without it passes.
6. Bad values are exit 2 at file:line:column; core_attn on flash attention and patterns matching
   nothing are warnings.
7. The planner lists op-policy candidates and writes `mode: op`; the written plans explain to the
   planned peak.
8. A module checkpointed at two call sites (`shared`) under the op policy: each call's kept outputs
   are its own (the backward recomputes the second call first), so verify PASSes at dp 1 and 2;
   op-mode regions nested in one another are exit 2 at the plan.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402
from json_schema import validate_file  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()


def run(*args, env=None, timeout=300):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=timeout,
                       env=None if env is None else {**os.environ, **env})
    return p.returncode, p.stdout + p.stderr


def explained(model, plan, tmp, kind="explain"):
    out = os.path.join(tmp, "e.json")
    rc, text = run("explain", model, plan, "--cluster", f"{ROOT}/clusters/h100_8x8.yaml", "--json", out)
    if not check(rc == 0, f"explain {plan}: exit {rc}\n{text[-2000:]}"):
        return None
    err = validate_file(out, kind)
    check(err is None, f"explain {plan}: {err}")
    return json.load(open(out))


def recompute_flops(e):
    t = e["time"][0]
    return t["gemm_flops"] - t["model_flops"]


def peak(e):
    return e["memory"][0]["predicted_peak_bytes"]


def write(path, text):
    open(path, "w").write(text)
    return path


AC = {
    "none": "",
    "full": 'activation_checkpointing: ["{m}"]\n',
    "op": 'activation_checkpointing: {{modules: ["{m}"], mode: op}}\n',
    "core_attn": 'activation_checkpointing: {{modules: ["{m}"], mode: core_attn}}\n',
    "core_attn_every2": 'activation_checkpointing: {{modules: ["{m}"], mode: core_attn, every: 2}}\n',
}

with tempfile.TemporaryDirectory() as tmp:
    # 1. five linears, one of them with a bias
    rows, width = 8, 16
    chain = write(os.path.join(tmp, "chain.yaml"), f"""name: chain
seed: 3
batch:
  input: [{rows}, {width}]
  target: [{rows}, {width}]
modules:
  - name: block
    type: sequential
    modules:
      - {{name: a, type: linear, in: {width}, out: {width}, bias: false}}
      - {{name: b, type: linear, in: {width}, out: {width}, bias: false}}
      - {{name: c, type: linear, in: {width}, out: {width}, bias: true}}
      - {{name: d, type: linear, in: {width}, out: {width}, bias: false}}
      - {{name: e, type: linear, in: {width}, out: {width}, bias: false}}
loss: mse
optimizer: {{type: adamw}}
steps: 2
""")
    one = 2 * rows * width * width  # one linear's forward FLOPs
    expect = {"none": 0, "full": 5 * one, "op": 3 * one}
    for mode, flops in expect.items():
        plan = write(os.path.join(tmp, f"chain_{mode}.yaml"),
                     "mesh: {dp: 2}\ndata_parallel: {mode: replicate}\n" + AC[mode].format(m="block"))
        e = explained(chain, plan, tmp)
        if e:
            check(recompute_flops(e) == flops // 2,  # per rank: the batch's rows over dp 2
                  f"chain {mode}: recompute FLOPs {recompute_flops(e)}, expected {flops // 2}")
            calls = {c["fqn"]: c for c in e["calls"]}
            check(calls["block"].get("recompute", "") == ("" if mode == "none" else mode),
                  f"chain {mode}: explain names block's recompute {calls['block'].get('recompute')!r}")
        rc, out = run("verify", chain, plan)
        check(rc == 0 and "PASS" in out, f"chain {mode}: verify exit {rc}\n{out[-1500:]}")

    # 2. GPT-2, eager attention: B 2 per rank (4 rows over dp 2), H 4, T 16, hd 8, two blocks
    gpt2 = f"{ROOT}/models/gpt2_tied.yaml"
    B, H, T, hd, blocks = 2, 4, 16, 8, 2
    runs = {}
    for mode in ("none", "core_attn", "core_attn_every2"):
        plan = write(os.path.join(tmp, f"gpt2_{mode}.yaml"),
                     "mesh: {dp: 2}\ndata_parallel: {mode: replicate}\n" + AC[mode].format(m="h.*"))
        runs[mode] = explained(gpt2, plan, tmp)
        rc, out = run("verify", gpt2, plan)
        check(rc == 0 and "PASS" in out, f"gpt2 {mode}: verify exit {rc}\n{out[-1500:]}")
    if all(runs.values()):
        per_attention = 2 * B * H * T * T * hd
        for mode, n in (("core_attn", blocks), ("core_attn_every2", 1)):
            check(recompute_flops(runs[mode]) == n * per_attention,
                  f"gpt2 {mode}: recompute FLOPs {recompute_flops(runs[mode])}, expected {n} x {per_attention}")
            act = runs["none"]["memory"][0]["at_peak"]["activations"] - runs[mode]["memory"][0]["at_peak"]["activations"]
            check(act == n * B * H * T * T * 4,
                  f"gpt2 {mode}: {act} B fewer activations at the peak, expected {n} x {B * H * T * T * 4}")
        recomputing = [c["fqn"] for c in runs["core_attn_every2"]["calls"] if c.get("recompute") == "core_attn"]
        check(recomputing == ["h.1.attn_block.attn"],
              f"gpt2 core_attn every 2: recomputing {recomputing}, expected h.1.attn_block.attn")

    # 3. Llama 3.1 (flash attention): B 2, T 8, dim 32, 4 heads of 8, 2 kv heads, hidden 48, 2 layers
    llama = f"{ROOT}/models/hf_tiny_llama31.yaml"
    N, dim, kv, hidden, heads, T = 16, 32, 16, 48, 4, 8
    e = {}
    for mode in ("none", "full", "op"):
        plan = write(os.path.join(tmp, f"llama_{mode}.yaml"),
                     "mesh: {dp: 1}\ndata_parallel: {mode: replicate}\n" + AC[mode].format(m="model.layers.*"))
        e[mode] = explained(llama, plan, tmp)
    if all(e.values()):
        kept = 2 * N * (dim * dim + dim * kv + dim * hidden + hidden * dim)  # q, v, gate, down
        # q k^T and p v: B H T^2 hd each, of which a causal flash kernel computes the (T + 1) / 2T
        # on and below the diagonal
        sdpa = 2 * (2 * 2 * heads * T * T * 8) * (T + 1) // (2 * T)
        check(recompute_flops(e["full"]) - recompute_flops(e["op"]) == 2 * (kept + sdpa),
              f"llama: full - op recompute {recompute_flops(e['full']) - recompute_flops(e['op'])}, "
              f"expected 2 layers x {kept + sdpa}")
        check(peak(e["full"]) < peak(e["op"]) < peak(e["none"]),
              f"llama peaks full {peak(e['full'])} < op {peak(e['op'])} < none {peak(e['none'])}")

    # 4. every N: the N-th, 2N-th ... matching module (counted from 1)
    mlp8 = f"{ROOT}/tests/data/models/mlp_stacked_8.yaml"
    if os.path.exists(mlp8):
        for every, want in ((1, 8), (2, 4), (3, 2), (9, 0)):
            plan = write(os.path.join(tmp, "every.yaml"),
                         f'mesh: {{dp: 1}}\nactivation_checkpointing: {{modules: ["layers.*"], every: {every}}}\n')
            ex = explained(mlp8, plan, tmp)
            if ex:
                got = [c["fqn"] for c in ex["calls"] if c["checkpointed"]]
                check(len(got) == want and all(int(f.split(".")[1]) % every == every - 1 for f in got),
                      f"every {every}: checkpointed {got}")
    else:
        check(False, f"{mlp8} is missing")

    # 5. a stale kept output is caught, in the region's backward
    piped = f"{ROOT}/tests/data/pipeline/llama_rope_pp2_tp2_sp_sac.yaml"
    rope = f"{ROOT}/models/llama_rope.yaml"
    rc, out = run("verify", rope, piped)
    check(rc == 0 and "PASS" in out, f"pipeline op policy: verify exit {rc}\n{out[-1500:]}")
    for region in ("layers.0", "layers.1"):
        rc, out = run("verify", rope, piped, env={"PTOOL_FAULT": f"sac_stale_output:{region}"})
        check(rc == 1 and f"first divergence: step 0 backward `{region}." in out,
              f"sac_stale_output:{region}: exit {rc}\n{out[-2500:]}")

    # 8. a shared module checkpointed at both its call sites; nested op-policy regions refused
    shared = write(os.path.join(tmp, "shared.yaml"), """seed: 8
batch:
  input: [4, 6]
modules:
  - name: blk
    type: sequential
    modules:
      - {name: up, type: linear, in: 6, out: 6, bias: false}
      - {name: t, type: tanh}
      - name: inner
        type: sequential
        modules:
          - {name: a, type: linear, in: 6, out: 6, bias: false}
          - {name: t2, type: tanh}
  - {name: blk2, type: shared, module: blk}
loss: mean
steps: 2
""")
    for dp in (1, 2):
        plan = write(os.path.join(tmp, f"shared_op_{dp}.yaml"),
                     f'mesh: {{dp: {dp}}}\ndata_parallel: {{mode: replicate}}\n'
                     'activation_checkpointing: {modules: ["blk"], mode: op}\n')
        rc, out = run("verify", shared, plan)
        check(rc == 0 and "PASS" in out, f"shared module under the op policy, dp {dp}: exit {rc}\n{out[-1500:]}")
    plan = write(os.path.join(tmp, "nested_op.yaml"), 'mesh: {dp: 1}\n'
                 'activation_checkpointing: {modules: ["blk", "blk.inner"], mode: op}\n')
    rc, out = run("verify", shared, plan)
    check(rc == 2 and f"{plan}:2:" in out and "'blk.inner' inside 'blk'" in out,
          f"nested op-policy regions: exit {rc}, expected 2 at the plan\n{out[-800:]}")
    # nested through a `shared` alias (blk called inside outer), and the root selected: refused too
    aliased = write(os.path.join(tmp, "aliased.yaml"), """batch: {input: [4, 6]}
modules:
  - name: blk
    type: sequential
    modules:
      - {name: up, type: linear, in: 6, out: 6, bias: false}
  - name: outer
    type: sequential
    modules:
      - {name: a, type: linear, in: 6, out: 6, bias: false}
      - {name: again, type: shared, module: blk}
loss: mean
""")
    for mods, says in (('["blk", "outer"]', "'outer.again' inside 'outer'"), ('["", "blk"]', "'blk' inside '(root)'")):
        plan = write(os.path.join(tmp, "nested_alias.yaml"),
                     f'mesh: {{dp: 1}}\nactivation_checkpointing: {{modules: {mods}, mode: op}}\n')
        rc, out = run("verify", aliased, plan)
        check(rc == 2 and says in out, f"nested op regions {mods}: exit {rc}, expected 2 saying {says!r}\n{out[-800:]}")
    plan = write(os.path.join(tmp, "nested_full.yaml"), 'mesh: {dp: 1}\n'
                 'activation_checkpointing: {modules: ["blk", "blk.inner"], mode: full}\n')
    rc, out = run("verify", shared, plan)
    check(rc == 0 and "PASS" in out, f"nested full checkpointing: exit {rc}\n{out[-1500:]}")

    # 6. bad values, warnings
    bad = {
        'activation_checkpointing: {modules: ["h.*"], mode: selective}\n': "unknown activation_checkpointing mode 'selective'",
        'activation_checkpointing: {modules: ["h.*"], every: 0}\n': "'every'",
        'activation_checkpointing: {modules: ["h.*"], every: two}\n': "'every'",
        'activation_checkpointing: {modules: ["h.*"], every: 2000000}\n': "over the limit",
        'activation_checkpointing: {modules: []}\n': "is empty",
        'activation_checkpointing: {mode: op}\n': "modules",
        'activation_checkpointing: {modules: ["h.*"], policy: op}\n': "policy",
        'activation_checkpointing: []\n': "is empty",
    }
    for text, says in bad.items():
        plan = write(os.path.join(tmp, "bad.yaml"), "mesh: {dp: 2}\ndata_parallel: {mode: replicate}\n" + text)
        for cmd in ("verify", "explain"):
            rc, out = run(cmd, gpt2, plan)
            check(rc == 2 and re.search(re.escape(plan) + r":3:\d+: ", out) and says in out,
                  f"{cmd} with {text.strip()}: exit {rc}, expected 2 at {plan}:3 saying {says!r}\n{out[-800:]}")
    plan = write(os.path.join(tmp, "warn.yaml"),
                 'mesh: {dp: 1}\nactivation_checkpointing: {modules: ["model.layers.*", "nothing"], mode: core_attn}\n')
    rc, out = run("explain", llama, plan)
    check(rc == 0 and "is flash, which recomputes its probabilities in backward already" in out
          and "pattern 'nothing' matched no module" in out, f"core_attn on flash: exit {rc}\n{out[-1500:]}")

    # 7. the planner: op-policy candidates, written as mode: op, explained to the planned peak
    out_json = os.path.join(tmp, "plan.json")
    rc, out = run("plan", f"{ROOT}/models/scale/llama3_8b.yaml", "--cluster", f"{ROOT}/clusters/h100_8x8.yaml",
                  "--world-size", "8", "--json", out_json, "--top", "20")
    if check(rc == 0, f"plan llama3_8b: exit {rc}\n{out[-1500:]}"):
        err = validate_file(out_json, "plan")
        check(err is None, f"plan --json: {err}")
        cands = json.load(open(out_json))["candidates"]
        ops = [c for c in cands if c["activation_checkpointing_mode"] == "op"]
        check(ops, f"plan llama3_8b: no op-policy candidate in {[c['activation_checkpointing_mode'] for c in cands]}")
        check(all(c["activation_checkpointing"] == (c["activation_checkpointing_mode"] != "") for c in cands),
              "plan --json: activation_checkpointing is not whether a mode is named")
        for k, c in enumerate(ops[:2]):
            path = write(os.path.join(tmp, f"planned_{k}.yaml"), c["plan"])
            check("mode: op" in c["plan"], f"planned op candidate: no `mode: op`\n{c['plan']}")
            ex = explained(f"{ROOT}/models/scale/llama3_8b.yaml", path, tmp)
            if ex:  # the planner's peak (PyTorch's allocated) is extrapolated over the blocks
                planned, allocated = c["peak_bytes"], ex["memory"][0]["allocated_peak_bytes"]
                check(abs(planned - allocated) <= 1e-4 * allocated,
                      f"{path}: explain's allocated peak {allocated}, planned {planned:.0f}")

check.finish()
