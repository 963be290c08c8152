#!/usr/bin/env python3
"""End-to-end float8 cases of `ptool verify` and `ptool explain`, run by ctest.

    float8_cases.py PTOOL ROOT

Every plan under tests/data/float8/ (torchao's Float8Linear: tensorwise under FSDP x TP+SP, with
FSDP2's float8 all-gather, and under CP x TP; rowwise under DDP and FSDP x TP+SP;
rowwise_with_gw_hp under FSDP x TP+SP) passes against the one-device reference in rank threads and under mpirun, with the same
per-tensor verdicts; explain --json lists the linears it converts (every one with dims of 16 but the
output head) and its text says so; a zero-bubble pipeline of FSDP x TP stages passes (the selection
is the whole model's, not a stage's); explain's predicted peak of every rank is verify's measured one
to the byte; FSDP2's float8 all-gather computes the plain plan's numbers with a quarter of its
gathered bytes, and its stale-scale and float8-master faults fail it; without the amax reductions (float8_local_amax on every
converted linear at once) the same plans fail; in bfloat16 compute (following the reference's casts
at near-ties) the three recipes and FSDP2's float8 all-gather pass and faults fail; float64 compute is
exit 2; a bad section is exit 2 with file:line:column. The fault classes' detection and localisation per linear are the mutation
score's (tests/mutation_score.py).
"""
import glob
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
PLANS = sorted(glob.glob(f"{ROOT}/tests/data/float8/*.yaml"))
MODEL = f"{ROOT}/models/llama_rope.yaml"


def run(*args, env=None, mpi=0):
    cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(mpi)] if mpi else []
    p = subprocess.run(cmd + [PTOOL, *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def verify(plan, env=None, mpi=0, peaks=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        rc, text = run("verify", MODEL, plan, "--json", out, "-q", env=env, mpi=mpi)
        doc = json.load(open(out))["plans"][0] if os.path.exists(out) else {"tensors": [], "memory": []}
        if peaks is not None:
            peaks.update({m["rank"]: m["measured_peak_bytes"] for m in doc["memory"]})
        return rc, text, {t["name"]: t["pass"] for t in doc["tensors"]}


check(len(PLANS) >= 2, f"tests/data/float8 has {len(PLANS)} plans")
has_mpi = subprocess.run(["which", "mpirun"], capture_output=True).returncode == 0
for plan in PLANS:
    name = os.path.basename(plan)
    measured = {}
    rc, out, threads = verify(plan, peaks=measured)
    check(rc == 0 and len(threads) > 100 and all(threads.values()), f"{name}: threads exit {rc}\n{out[-2000:]}")
    if has_mpi:
        world = 1
        for size in re.search(r"^mesh: \{(.*)\}", open(plan).read(), re.M).group(1).split(","):
            world *= int(size.split(":")[1])
        rc, out, procs = verify(plan, mpi=world)
        check(rc == 0 and procs == threads, f"{name}: mpirun exit {rc}, verdicts as the threads' {procs == threads}\n{out[-2000:]}")
    with tempfile.TemporaryDirectory() as tmp:
        ej = os.path.join(tmp, "e.json")
        rc, out = run("explain", MODEL, plan, "--json", ej)
        doc = json.load(open(ej)) if rc == 0 else {"float8": {"linears": []}, "memory": []}
        err = validate_file(ej, "explain") if rc == 0 else f"exit {rc}"  # the recipe's name among the schema's
        check(err is None, f"{name}: explain --json against docs/schema: {err}")
        linears = doc["float8"]["linears"]
        # explain's simulation holds what the run holds, the emulation's float32 casts included
        predicted = {r: m["predicted_peak_bytes"] for m in doc["memory"] for r in m["ranks"]}
    check(predicted == measured and measured, f"{name}: explain predicts {predicted}, verify measured {measured}")
    check(len(linears) == 14 and "output" not in linears and all(l.endswith("_proj") for l in linears),
          f"{name}: explain's float8 linears {linears}")
    recipe = re.search(r"^float8:.*?recipe: (\w+)", open(plan).read(), re.M | re.S).group(1)
    check(f"float8 {recipe} on 14 linears" in out, f"{name}: explain's text does not say float8 {recipe}\n{out[:800]}")
    if "tp" in name and recipe == "tensorwise":  # every scale from its own piece: the plan fails (one linear at a time: mutation score)
        rc, out, _ = verify(plan, env={"PTOOL_FAULT": "float8_local_amax:*"})
        check(rc == 1 and "first divergence: step 0 forward" in out, f"{name}: local amax on every linear: exit {rc}\n{out[-1500:]}")
    elif "tp" in name:  # rowwise (and rowwise_with_gw_hp's tensorwise weight): power-of-2 scales, so a piece's own amax moves no value out of e4m3fn's normal range
        rc, out, local = verify(plan, env={"PTOOL_FAULT": "float8_local_amax:*"})
        check(rc == 0 and local == threads, f"{name}: rowwise local amax on ordinary data: exit {rc}\n{out[-1500:]}")

# FSDP2's float8 all-gather: the same numbers as the plain plan's (each shard cast with the whole
# weight's scale is the cast of the gathered weight), every tensor's error the same to the bit, with
# a quarter of the float32 weights' all_gather bytes; its faults: a scale precomputed before the
# optimizer step first shows in the next step's forward, a master kept in float8 in the step's update
with tempfile.TemporaryDirectory() as tmp:
    gathered = f"{ROOT}/tests/data/float8/llama_rope_fsdp_tp_float8_all_gather.yaml"
    plain = os.path.join(tmp, "plain.yaml")
    text = open(gathered).read()
    open(plain, "w").write(text.replace("  enable_fsdp_float8_all_gather: true\n", "")
                           .replace("  precompute_float8_dynamic_scale_for_fsdp: true\n", ""))
    out = os.path.join(tmp, "both.json")
    rc, log = run("verify", MODEL, gathered, plain, "--json", out, "-q")
    plans = json.load(open(out))["plans"] if rc == 0 else []
    if check(rc == 0 and len(plans) == 2, f"float8 all-gather beside the plain plan: exit {rc}\n{log[-1500:]}"):
        errors = [[(t["name"], t["max_abs"], t["max_rel"]) for t in p["tensors"]] for p in plans]
        check(errors[0] == errors[1] and len(errors[0]) > 150,
              f"float8 all-gather: {sum(a != b for a, b in zip(*errors))} tensors' errors differ from the plain plan's")
        # the blocks' units: their linears' weights one byte an element, their norms' four
        gathers = [sum(c["bytes"] for c in p["collectives"]["steps"]
                       if c["op"] == "all_gather" and c["mesh_dim"] == "dp" and c["module"].startswith("layers."))
                   for p in plans]
        check(0.25 < gathers[0] / gathers[1] < 0.3,
              f"float8 all-gather moves {gathers[0]} bytes of the blocks' weights where float32 moves {gathers[1]}")
    for fault, where in (("float8_stale_scale:*", "first divergence: step 1 forward"),
                         ("float8_master:*", "first divergence: step 0 update of")):
        rc, log, _ = verify(gathered, env={"PTOOL_FAULT": fault})
        check(rc == 1 and where in log, f"{fault}: exit {rc}, expected '{where}'\n{log[-1500:]}")
    bad = os.path.join(tmp, "bad_precompute.yaml")
    open(bad, "w").write("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard}\n"
                         "float8: {recipe: tensorwise, precompute_float8_dynamic_scale_for_fsdp: true}\n")
    rc, log = run("verify", MODEL, bad)
    check(rc == 2 and "bad_precompute.yaml:3:72: precompute_float8_dynamic_scale_for_fsdp precomputes" in log,
          f"precompute without the float8 all-gather: exit {rc}\n{log}")
    ddp = os.path.join(tmp, "ddp.yaml")  # nothing to gather: explain says so, verify runs the plain plan
    open(ddp, "w").write("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp}\n"
                         "float8: {recipe: tensorwise, enable_fsdp_float8_all_gather: true}\n")
    rc, log = run("explain", MODEL, ddp)
    check(rc == 0 and "enable_fsdp_float8_all_gather: no fully_shard over several ranks here" in log,
          f"float8 all-gather under DDP: explain exit {rc}\n{log[-800:]}")
    rc, log, verdicts = verify(ddp)
    check(rc == 0 and verdicts and all(verdicts.values()), f"float8 all-gather under DDP: verify exit {rc}\n{log[-800:]}")

# the rowwise recipe (per-row and per-column power-of-2 scales, e4m3fn throughout): under FSDP x
# load-balanced CP each rank's weight-gradient scales cover its own rows and positions, which the
# reference scales apart
with tempfile.TemporaryDirectory() as tmp:
    fsdp_cp = os.path.join(tmp, "fsdp_cp_rowwise.yaml")
    open(fsdp_cp, "w").write(open(f"{ROOT}/plans/llama_rope_fsdp_cp.yaml").read() + "float8: {recipe: rowwise}\n")
    rc, log, verdicts = verify(fsdp_cp)
    check(rc == 0 and len(verdicts) > 100 and all(verdicts.values()), f"rowwise FSDP x CP: exit {rc}\n{log[-1500:]}")

# a pipeline's stages: the selection is the whole model's (stage 0 holds no head, yet its last
# linear stays float8), under zero-bubble's split backward (a W keeps its I's scales) and FSDP x TP
with tempfile.TemporaryDirectory() as tmp:
    piped = os.path.join(tmp, "pp.yaml")
    text = open(f"{ROOT}/tests/data/pipeline/llama_rope_pp2_dp2_tp2_fsdp_zb.yaml").read()
    open(piped, "w").write("".join(l for l in text.splitlines(True) if "mixed_precision" not in l)
                           + "float8: {recipe: tensorwise}\n")
    rc, out, verdicts = verify(piped)
    check(rc == 0 and len(verdicts) > 100 and all(verdicts.values()), f"pipeline float8: exit {rc}\n{out[-2000:]}")

with tempfile.TemporaryDirectory() as tmp:
    bf16 = os.path.join(tmp, "bf16.yaml")
    text = open(f"{ROOT}/tests/data/float8/llama_rope_fsdp_tp_float8.yaml").read().replace("  mode: fully_shard\n",
                                         "  mode: fully_shard\n  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}\n")
    open(bf16, "w").write(text)
    # bf16 compute (torchtitan's float8 runs): the parallel run follows the reference's casts at
    # near-ties (model/float8_log.h) and passes; casting every value of its own it fails (bf16's
    # rounding before a cast becomes a whole float8 step at a rounding boundary); a real float8
    # fault still fails
    rc, out, verdicts = verify(bf16)
    check(rc == 0 and len(verdicts) > 100 and all(verdicts.values()), f"bf16 float8 verify: exit {rc}\n{out[-1500:]}")
    rc, out = run("verify", MODEL, bf16)
    taken = re.search(r"float8: the reference logged its (\d+) float8 operands .* value for (\d+) elements", out)
    check(rc == 0 and taken and int(taken.group(1)) > 0 and int(taken.group(2)) > 0, f"bf16 float8 note:\n{out[-1500:]}")
    rc, out = run("verify", MODEL, bf16, "--no-tie-replay")
    check(rc == 1 and "cast every value of its own" in out, f"bf16 float8 without the follow: exit {rc}\n{out[-800:]}")
    rc, out = run("verify", MODEL, bf16, env={"PTOOL_FAULT": "float8_e4m3_grad:*"})
    check(rc == 1, f"bf16 float8 with float8_e4m3_grad: exit {rc}\n{out[-800:]}")
    rowwise_bf16 = os.path.join(tmp, "bf16_rowwise.yaml")
    open(rowwise_bf16, "w").write(text.replace("float8: {recipe: tensorwise}", "float8: {recipe: rowwise}"))
    rc, out, verdicts = verify(rowwise_bf16)
    check(rc == 0 and len(verdicts) > 100 and all(verdicts.values()), f"bf16 rowwise float8 verify: exit {rc}\n{out[-1500:]}")
    gw_hp_bf16 = os.path.join(tmp, "bf16_gw_hp.yaml")  # its weight gradient a bf16 GEMM, as a plain linear's
    open(gw_hp_bf16, "w").write(text.replace("float8: {recipe: tensorwise}", "float8: {recipe: rowwise_with_gw_hp}"))
    rc, out, verdicts = verify(gw_hp_bf16)
    check(rc == 0 and len(verdicts) > 100 and all(verdicts.values()), f"bf16 rowwise_with_gw_hp verify: exit {rc}\n{out[-1500:]}")
    # torchtitan's published float8 configuration: bf16 compute with FSDP2's float8 all-gather and
    # precomputed scales. Its gathers cast the float32 master shards, so the reference casts its
    # weights from its masters too (Float8Spec::weights_from_masters; casting its bf16 copies it
    # failed 132/171 at step 0); a scale precomputed before the optimizer step still fails
    gathered_bf16 = os.path.join(tmp, "bf16_all_gather.yaml")
    open(gathered_bf16, "w").write(open(f"{ROOT}/tests/data/float8/llama_rope_fsdp_tp_float8_all_gather.yaml").read()
                                   .replace("  mode: fully_shard\n", "  mode: fully_shard\n  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}\n"))
    check("bfloat16" in open(gathered_bf16).read(), "the bf16 all-gather plan was not written")
    rc, out, verdicts = verify(gathered_bf16)
    check(rc == 0 and len(verdicts) > 150 and all(verdicts.values()), f"bf16 float8 all-gather verify: exit {rc}\n{out[-1500:]}")
    if has_mpi:
        rc, out, procs = verify(gathered_bf16, mpi=4)
        check(rc == 0 and procs == verdicts, f"bf16 float8 all-gather under mpirun: exit {rc}\n{out[-1500:]}")
    # beside the plain bf16 float8 plan in one job: each its own reference (bf16 copies cast there)
    rc, out = run("verify", MODEL, bf16, gathered_bf16, "--steps", "2")
    check(rc == 0 and out.count("PASS") >= 2 and "FAIL" not in out, f"bf16 float8 plain and all-gather in one job: exit {rc}\n{out[-1500:]}")
    # the reference picks the weights as fully_shard does, by name: a tied head's weight is the
    # embedding's (gathered in bf16; the reference's copy was uint8 codes read as a table: exit 3),
    # and under replicate() with fully_shard units only those units' float8 weights
    tied = os.path.join(tmp, "tied.yaml")
    open(tied, "w").write("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  mode: fully_shard\n"
                          "  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}\n"
                          "float8: {recipe: tensorwise, filter_fqns: [zzz], enable_fsdp_float8_all_gather: true}\n")
    rc, out = run("verify", f"{ROOT}/models/gpt2_tied.yaml", tied)
    check(rc == 0 and "PASS" in out, f"bf16 float8 all-gather of a tied head: exit {rc}\n{out[-1500:]}")
    units = os.path.join(tmp, "units.yaml")
    open(units, "w").write(open(gathered_bf16).read().replace("  mode: fully_shard\n", "  mode: replicate\n")
                           .replace('fully_shard: ["layers.*"]', 'fully_shard: ["layers.0"]'))
    rc, out = run("verify", MODEL, units)
    check(rc == 0 and "PASS" in out, f"bf16 float8 all-gather of replicate()'s fully_shard units: exit {rc}\n{out[-1500:]}")
    ej = os.path.join(tmp, "units.json")
    rc, out = run("explain", MODEL, units, "--json", ej)
    f8 = json.load(open(ej))["float8"] if rc == 0 else {}
    check(f8.get("fsdp_float8_all_gather") is True, f"replicate()'s fully_shard units gather in float8: exit {rc}, {f8}")
    rc, out = run("verify", MODEL, gathered_bf16, env={"PTOOL_FAULT": "float8_stale_scale:*"})
    check(rc == 1 and "first divergence: step 1" in out, f"bf16 float8 all-gather with float8_stale_scale: exit {rc}\n{out[-800:]}")
    rc, out = run("verify", MODEL, f"{ROOT}/tests/data/float8/llama_rope_fsdp_tp_float8.yaml", "--dtype", "float64")  # the emulation accumulates in float32
    check(rc == 2 and "float8 with float64 compute" in out and "float32 or bfloat16" in out, f"float64 float8 verify: exit {rc}\n{out[-800:]}")
    # float32 meets near-ties too: the long ring-CP plan under rowwise flips one e4m3fn tie of
    # o_proj's input (after the ring's log-sum-exp merges) without the follow
    ring = os.path.join(tmp, "ring_rowwise.yaml")
    open(ring, "w").write(open(f"{ROOT}/plans/llama_rope_long_ring_fsdp_cp.yaml").read() + "float8: {recipe: rowwise}\n")
    long_model = f"{ROOT}/models/llama_rope_long.yaml"
    rc, out = run("verify", long_model, ring, "--steps", "1")
    check(rc == 0 and "PASS" in out, f"ring-CP rowwise float8: exit {rc}\n{out[-1500:]}")
    rc, out = run("verify", long_model, ring, "--steps", "1", "--no-tie-replay")
    check(rc == 1 and "first divergence: step 0 forward `layers.1.attn_block.attention.o_proj` output" in out,
          f"ring-CP rowwise float8 without the follow: exit {rc}\n{out[-1500:]}")
    rc, out = run("explain", MODEL, bf16)
    check(rc == 0 and "float8 tensorwise on 14 linears" in out, f"bf16 float8 explain: exit {rc}\n{out[-800:]}")
    bad = os.path.join(tmp, "bad.yaml")
    open(bad, "w").write("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp}\nfloat8: {recipe: tensorwise, filter_fqns: [proj, output]}\n")
    rc, out = run("verify", MODEL, bad)
    check(rc == 2 and "bad.yaml:3:9: float8: no linear of the model is converted" in out, f"float8 converting nothing: exit {rc}\n{out}")

# explain prices float8 GEMMs at the kernel table's float8 rows (the H200's measured, the H100's
# derived from the H200's ratios: docs/kernel_table.md), else as the compute dtype's (a table
# without them, the A100's derived from the H100's by peaks: the ratio of float8 to bf16 GEMM seconds
# is the H100's, and explain says which): Llama-3-8B under FSDP2 on 8 GPUs in bf16
with tempfile.TemporaryDirectory() as tmp:
    bf16_plan, f8_plan = os.path.join(tmp, "bf16.yaml"), os.path.join(tmp, "f8.yaml")
    base = ("mesh: {dp: 8}\ndata_parallel:\n  mesh_dim: dp\n  mode: fully_shard\n  fully_shard: [\"layers.*\"]\n"
            "  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}\nactivation_checkpointing: [\"layers.*\"]\n")
    open(bf16_plan, "w").write(base)
    open(f8_plan, "w").write(base + "float8: {recipe: tensorwise}\n")
    gemm = {}
    for gpu in ("h200", "h100"):
        for name, plan in (("bf16", bf16_plan), ("f8", f8_plan)):
            ej = os.path.join(tmp, f"{gpu}_{name}.json")
            rc, out = run("explain", f"{ROOT}/models/scale/llama3_8b.yaml", plan, "--cluster", f"{ROOT}/clusters/{gpu}_8x8.yaml",
                          "--json", ej)
            if not check(rc == 0, f"explain llama3_8b {name} on {gpu}: exit {rc}\n{out[-1500:]}"):
                continue
            t = json.load(open(ej))["time"][0]["compute_terms"]
            gemm[gpu, name] = (sum(t[f"gemm_{op}_seconds"] for op in ("fwd", "dgrad", "wgrad")),
                               sum(g["calls"] for g in t["gemms"] if g.get("float8")), out)
    if len(gemm) == 4:
        (h200_bf16, n0, _), (h200_f8, n8, text200) = gemm["h200", "bf16"], gemm["h200", "f8"]
        (h100_bf16, _, _), (h100_f8, _, text100) = gemm["h100", "bf16"], gemm["h100", "f8"]
        check(n0 == 0 and n8 > 0 and h200_f8 < 0.8 * h200_bf16,
              f"H200: float8 GEMMs {n8} calls, {h200_f8:.3f} s against bf16's {h200_bf16:.3f} s")
        # the H100's derived rows: its bf16 x the H200's float8/bf16 per shape and op, so the same
        # speed-up give or take how the two GPUs' bf16 differ shape by shape (0.89-1.08 on the rows)
        check(h100_f8 < 0.8 * h100_bf16 and abs((h100_bf16 / h100_f8) / (h200_bf16 / h200_f8) - 1) < 0.1
              and "the kernel table's float8 rows" in text100 and "the kernel table's float8 rows" in text200,
              f"H100 (derived float8 rows): {h100_f8} s against bf16's {h100_bf16} s; H200 {h200_f8} against {h200_bf16}")
        print(f"Llama-3-8B FSDP2 x 8 GEMM seconds a step: H200 bf16 {h200_bf16:.3f}, float8 {h200_f8:.3f} "
              f"({h200_bf16 / h200_f8:.2f}x); H100 bf16 {h100_bf16:.3f}, float8 {h100_f8:.3f} ({h100_bf16 / h100_f8:.2f}x)")

check.finish()
