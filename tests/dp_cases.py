#!/usr/bin/env python3
"""End-to-end data-parallel cases of `ptool verify`, run by ctest.

    dp_cases.py PTOOL ROOT GROUP      GROUP: cases | faults | bad_plans | mpi | explain
cases: every shipped replicate / fully_shard / dp x tp case at 2 and 4 dp ranks: the expected
verdict (parity at the seed's tolerance, or the failure with its named cause), replicas bitwise
equal where DDP makes them so, ignored modules' gradients different across ranks, the state_dict
invariants, and DDP's bucket accounting (one all_reduce per bucket, all_reduce bytes = gradient
bytes, no bucket copies with gradient_as_bucket_view).
faults: each injected data-parallel bug (PTOOL_FAULT) exits 1 and names the tensor it breaks.
bad_plans: data_parallel schema and lint errors exit 2 with file:line:column and the message.
mpi: a dp x tp case (and FSDP x cp on masked targets) under `mpirun -np 4` gives the same verdicts and
bitwise the same numbers.
explain: the collectives `ptool explain` derives equal those `ptool verify` measures.
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

PTOOL, ROOT, GROUP = sys.argv[1], sys.argv[2], sys.argv[3]
check = Checks()
SHUFFLED = f"{ROOT}/models/data/replicate_net_shuffled.safetensors"
SHARED_UNIT = f"{ROOT}/tests/data/mpy_shared_fully_shard.yaml"


def plan_path(plan):  # a shipped plan's name, or a path
    return plan if plan.startswith("/") else f"{ROOT}/plans/{plan}.yaml"


def plan_text(plan):
    return open(plan_path(plan)).read()


def verify(model, plan, *args, env=None, mpi=0):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [PTOOL, "verify", f"{ROOT}/models/{model}.yaml"]
        cmd += [plan_path(p) for p in plan.split(",")]
        cmd += ["--json", out, *args]
        if mpi:
            cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(mpi)] + cmd
        e = dict(os.environ, **(env or {}))
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=240)
        report = json.load(open(out)) if os.path.exists(out) else None
        return p.returncode, p.stdout + p.stderr, report


def data_parallel_collectives(plan_report, op, dim):  # clip_grad_norm's all_reduces ("(clip)") are not DDP's
    return [c for c in plan_report["collectives"]["steps"]
            if c["op"] == op and (dim is None or c["mesh_dim"] == dim) and c.get("module") != "(clip)"]


def calls(plan_report, op, dim=None):
    return sum(c["calls"] for c in data_parallel_collectives(plan_report, op, dim))


def bytes_of(plan_report, op, dim=None):
    return sum(c["bytes"] for c in data_parallel_collectives(plan_report, op, dim))


# model, plan, mesh override, extra args, expected exit, output fragments
CASES = [
    ("replicate_net", "replicate_single_module", "", [], 0, ["state_dict after construction: 6 keys"]),
    ("replicate_net", "replicate_single_module", "", ["--data", SHUFFLED], 0, []),
    ("replicate_net", "replicate_multi_module", "", ["--data", SHUFFLED], 0, []),
    ("replicate_net", "replicate_with_kwargs", "", ["--data", SHUFFLED], 0, ["bucket copies 0 B per step"]),
    ("replicate_net", "replicate_ignore_fc1", "", [], 0, []),
    ("toy_model", "replicate_fully_shard", "", [], 0, []),
    ("mpy", "mpy_bn_local", "", [], 1, ["cause:", "batch_norm 'm.1' normalises with the statistics of each rank's local batch",
                                        "first divergence: step 0 forward `m.1` output"]),
    ("mpy", "mpy_sync_bn", "", [], 0, []),
    ("mpy_shared", "mpy_shared_sync_bn", "", [], 0, ["6 unique parameters"]),
    # fully_shard of the shared module itself: gathered at both calls, its gradient summed over them
    ("mpy_shared", SHARED_UNIT, "", [], 0, ["6 unique parameters"]),
    ("mlp_stacked_mse", "mlp_stacked_dp2_tp2", "", [], 0, []),
    ("mlp_stacked_adamw", "mlp_stacked_dp2_tp2", "", [], 0, []),
    ("mlp_stacked_adamw", "mlp_stacked_dp2_tp4", "", [], 0, []),
    ("mlp_stacked_adamw", "mlp_stacked_fully_shard", "", [], 0, []),
    ("mlp_stacked_mse", "mlp_stacked_fully_shard", "", [], 0, []),
    ("mlp_stacked_adamw", "mlp_stacked_fsdp_tp", "", [], 0, []),
    ("mlp", "replicate_single_module", "", [], 1, ["cause:", "loss: sum under data parallel"]),
    # training configurations: accumulation 2 and clipping, checkpointing with dropout, bf16 mixed precision
    ("gpt2_tied", "gpt2_tied_ddp_ac", "", [], 0, []),
    ("llama_rope", "llama_rope_fsdp_tp_ac", "", [], 0, []),
    ("llama_rope", "llama_rope_ddp_tp_bf16", "", [], 0, ["mixed precision", "float32 master parameters"]),
]


def cases():
    for model, plan, _, args, want, fragments in CASES:
        for dp in (2, 4):
            if dp == 4 and model in ("replicate_net", "toy_model", "llama_rope", "gpt2_tied"):
                continue  # the seeds' global batches are 2 rows; 4 rows in 2 microbatches; 8 ranks of transformer
            a = list(args) + (["--mesh", f"dp={dp}"] if dp != 2 else [])
            rc, out, rep = verify(model, plan, *a)
            what = f"{model} x {plan} dp={dp} {' '.join(args)}"
            check(rc == want, f"{what}: exit {rc}, want {want}\n{out}")
            for f in fragments:
                check(f in out, f"{what}: missing '{f}' in\n{out}")
            if rep is None:
                continue
            p = rep["plans"][0]
            for t in p["tensors"]:
                if want == 0:
                    check(t["pass"], f"{what}: {t['name']} fails")
                if t["replicas"] == "DIFFER" and want == 0:
                    check(False, f"{what}: {t['name']} replicas differ")
                if "ignored_modules" in plan_text(plan) and ".fc1." in t["name"]:
                    check(t["replicas"] == "ignored", f"{what}: {t['name']} should differ across ranks, is {t['replicas']}")
            dpinfo = p["data_parallel"]
            steps = len({t["name"].split(".")[0] for t in p["tensors"]})
            if dpinfo["buckets"]:
                bn_calls = {"mpy_sync_bn": 1, "mpy_shared_sync_bn": 2}.get(plan, 0)  # SyncBatchNorm's backward all_reduce
                check(calls(p, "all_reduce", "dp") == (dpinfo["buckets"] + bn_calls) * steps,
                      f"{what}: {calls(p, 'all_reduce', 'dp')} all_reduce calls on dp for {dpinfo['buckets']} buckets x {steps} steps")
                if "sync_bn" not in plan:
                    check(bytes_of(p, "all_reduce", "dp") == dpinfo["gradient_bytes"] * steps,
                          f"{what}: all_reduce bytes {bytes_of(p, 'all_reduce', 'dp')} != gradient bytes {dpinfo['gradient_bytes']} x {steps}")
            if "gradient_as_bucket_view: true" in plan_text(plan):
                check(dpinfo["bucket_copy_bytes"] == 0, f"{what}: bucket views still copy {dpinfo['bucket_copy_bytes']} B")


FAULTS = [  # PTOOL_FAULT, model, plan, fragment the report must name
    ("skip_bucket:fc2.weight", "replicate_net", "replicate_multi_module", "step0.grad.fc2.weight"),
    ("grad_sum:*", "replicate_net", "replicate_single_module", "step0.grad.fc1.weight"),
    ("skip_buffer_broadcast:*", "mpy", "mpy_sync_bn", "m.1.running_mean"),
    ("sync_ignored:*", "replicate_net", "replicate_ignore_fc1", "step0.grad.fc1.weight"),
    ("skip_reduce_scatter:layers.0", "mlp_stacked_adamw", "mlp_stacked_fully_shard", "step0.grad.layers.0.net1.weight"),
    ("stale_param:layers.1", "mlp_stacked_adamw", "mlp_stacked_fully_shard", "step1.output"),
]


def faults():
    for fault, model, plan, fragment in FAULTS:
        rc, out, rep = verify(model, plan, env={"PTOOL_FAULT": fault})
        check(rc == 1, f"{fault}: exit {rc}, want 1\n{out}")
        bad = [t["name"] for t in rep["plans"][0]["tensors"] if not t["pass"]] if rep else []
        named = any(fragment in n for n in bad + rep["plans"][0]["notes"]) if rep else False
        check(named, f"{fault}: '{fragment}' not among the failures {bad[:6]}\n{out}")


BAD_PLANS = [  # plan text, model, message fragments (the first is file:line:column)
    ("mesh: {dp: 3}\ndata_parallel: {mesh_dim: dp}\n", "replicate_net",
     [":2:", "the global batch of 2 rows does not split evenly over the 3 ranks of 'dp' (rows per rank: 1, 1, 0)"]),
    ("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  ignored_modules: [fc4]\n", "replicate_net",
     [":4:", "ignored module 'fc4' is not a module of the model", "did you mean 'fc1'"]),
    ("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  modules: [\"\", fc1]\n", "replicate_net",
     [":4:", "replicate() on '' and on 'fc1' inside it"]),
    ("mesh: {dp: 2, tp: 2}\ntensor_parallel: {mesh_dim: tp, plan: {}}\ndata_parallel: {mesh_dim: tp}\n", "mlp",
     [":3:", "data_parallel and tensor_parallel both use mesh dim 'tp'"]),
    ("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  bucket_cap_mb: 0\n", "mlp", [":4:", "bucket_cap_mb 0 must be in (0, 1e6]"]),
    ("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  bucket_size: 1\n", "mlp", [":4:", "unknown key 'bucket_size'"]),
    ("mesh: {dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  mode: fully_shard\n  modules: [fc1]\n", "replicate_net",
     [":5:", "in mode fully_shard list units under 'fully_shard'"]),
]


def bad_plans():
    for i, (text, model, fragments) in enumerate(BAD_PLANS):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"bad{i}.yaml")
            open(path, "w").write(text)
            for cmd in ("verify", "explain"):
                p = subprocess.run([PTOOL, cmd, f"{ROOT}/models/{model}.yaml", path], capture_output=True, text=True, timeout=60)
                out = p.stdout + p.stderr
                check(p.returncode == 2 and all(f in out for f in fragments) and f"bad{i}.yaml{fragments[0]}" in out,
                      f"bad plan {i} ({cmd}): exit {p.returncode}, want 2 with {fragments}\n{out}")


def mpi():
    # (llama_sft: masked targets under global_tokens, the count all_reduced over the processes)
    for model, plan in (("mlp_stacked_adamw", "mlp_stacked_dp2_tp2"), ("mlp_stacked_adamw", "mlp_stacked_fsdp_tp"),
                        ("llama_sft", "llama_sft_fsdp_cp")):
        rc_t, out_t, rep_t = verify(model, plan)
        rc_m, out_m, rep_m = verify(model, plan, mpi=4)
        check(rc_t == 0 and rc_m == 0, f"mpi {plan}: exit threads {rc_t}, mpi {rc_m}\n{out_m}")
        if rep_t and rep_m:
            pt, pm = rep_t["plans"][0], rep_m["plans"][0]
            check(pm["backend"] == "mpi", f"mpi {plan}: backend {pm['backend']}")
            vt = {t["name"]: (t["max_abs"], t["replicas"]) for t in pt["tensors"]}
            vm = {t["name"]: (t["max_abs"], t["replicas"]) for t in pm["tensors"]}
            check(vt == vm, f"mpi {plan}: threads and mpi differ")


def explain():
    cases = {(m, p) for m, p, mesh, a, want, _ in CASES if want == 0}
    for model, plan in sorted(cases):
        with tempfile.TemporaryDirectory() as tmp:
            ej = os.path.join(tmp, "e.json")
            p = subprocess.run([PTOOL, "explain", f"{ROOT}/models/{model}.yaml", plan_path(plan), "--json", ej],
                               capture_output=True, text=True, timeout=120)
            if p.returncode != 0:
                check(False, f"explain {model} x {plan}: exit {p.returncode}\n{p.stderr}")
                continue
            derived = {}
            for c in json.load(open(ej))["collectives_per_step"]:
                derived.setdefault(c["op"], [0, 0])
                derived[c["op"]][0] += 1
                derived[c["op"]][1] += c["bytes"]
        rc, out, rep = verify(model, plan, "--steps", "1")
        measured = {}
        for c in rep["plans"][0]["collectives"]["steps"]:
            measured.setdefault(c["op"], [0, 0])
            measured[c["op"]][0] += c["calls"]
            measured[c["op"]][1] += c["bytes"]
        check(derived == measured, f"explain {model} x {plan}: derived {derived} != measured {measured}")


{"cases": cases, "faults": faults, "bad_plans": bad_plans, "mpi": mpi, "explain": explain}[GROUP]()
check.finish()
