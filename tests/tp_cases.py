#!/usr/bin/env python3
"""End-to-end tensor-parallel cases of `ptool verify`, run by ctest.

    tp_cases.py PTOOL ROOT GROUP      GROUP: seeds | faults | bad_plans | mpi | explain
seeds: every shipped test_parallelize_api case at world sizes 2, 4 and 8: exit 0, every tensor
agrees, the expected warnings, and src_data_rank's collective counts (1: > 0 at start; null: 0).
faults: each injected bug (PTOOL_FAULT) exits 1 and names the right module and phase.
bad_plans: schema errors and lint errors exit 2 with file:line:column and the message.
mpi: a TP case under `mpirun -np 4` gives the same verdicts and bitwise the same numbers as threads.
explain: the collectives `ptool explain` derives without running equal those `ptool verify` measures.
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


def verify(model, plan, *args, env=None, mpi=0):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [PTOOL, "verify", f"{ROOT}/models/{model}.yaml"]
        cmd += [p if p.startswith("/") else f"{ROOT}/plans/{p}.yaml" for p in plan.split(",")]
        cmd += ["--json", out, "-q", *args]
        if mpi:
            cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(mpi)] + cmd
        e = dict(os.environ, **(env or {}))
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=240)
        report = json.load(open(out)) if os.path.exists(out) else None
        return p.returncode, p.stdout + p.stderr, report


SEEDS = [  # model, plan, warning fragments
    ("mlp", "mlp_colwise_replicate", []),
    ("mlp_nested", "mlp_nested", []),
    ("linear_rowwise", "linear_rowwise", []),
    ("linear_colwise", "linear_colwise", []),
    ("linear_colwise", "under_mesh_context", []),
    ("identity", "prepare_input", []),
    ("identity", "prepare_output", []),
    ("identity", "prepare_input_output", []),
    ("mlp", "mlp_star", []),
    ("mlp", "mlp_question", []),
    ("mlp", "mlp_digit", []),
    ("mlp_stacked", "mlp_stacked_multi_wildcard", []),
    ("mlp", "mlp_root_module", []),
    ("mlp", "mlp_no_match", ["pattern 'net0.hello.world' matched no module", "pattern 'net3' matched no module"]),
    ("linear_colwise", "empty_plan", ["the tensor_parallel plan is empty"]),
    ("mlp", "mlp_src_data_rank_1", []),
    ("mlp", "mlp_src_data_rank_null", []),
]


def seeds():
    for ws in (4, 2, 8):
        for model, plan, warnings in SEEDS:
            rc, out, rep = verify(model, plan, "--mesh", f"tp={ws}")
            what = f"{model} x {plan} at tp={ws}"
            check(rc == 0 and rep and rep["pass"], f"{what}: exit {rc}\n{out}")
            if not rep:
                continue
            p = rep["plans"][0]
            check(p["world_size"] == ws and all(t["pass"] for t in p["tensors"]) and len(p["tensors"]) > 0,
                  f"{what}: tensors")
            for w in warnings:
                check(any(w in x for x in p["warnings"]), f"{what}: warning '{w}' missing: {p['warnings']}")
            start = sum(c["calls"] for c in p["collectives"]["start"])
            if plan == "mlp_src_data_rank_1":
                check(start > 0 and all(c["op"] == "broadcast" for c in p["collectives"]["start"]),
                      f"{what}: src_data_rank 1 sends the weights: {start} collectives at start")
            if plan == "mlp_src_data_rank_null":
                check(start == 0, f"{what}: src_data_rank null must not communicate at start, saw {start}")
    # transformer blocks: attention heads split across ranks (GQA too), Megatron MLPs
    for model, plan, sizes in (("gpt_block", "gpt_block_tp", (2, 4)), ("llama_block", "llama_block_tp", (2,)),
                               ("seq_mlp", "seq_mlp_sp", (2, 3, 4)), ("embedding_head", "embedding_colwise", (2, 3)),
                               ("embedding_head", "embedding_rowwise", (2, 5)), ("gpt2_tied", "gpt2_tied_tp_sp", (2, 4)),
                               ("llama_rope", "llama_rope_tp_sp", (2,))):
        for ws in sizes:
            rc, out, rep = verify(model, plan, "--mesh", f"tp={ws}")
            check(rc == 0 and rep["pass"] and len(rep["plans"][0]["tensors"]) >= 24, f"{model} x {plan} tp={ws}: {rc}\n{out}")
    # several plans: one reference, a matrix
    rc, out, rep = verify("mlp", "mlp_colwise_replicate,mlp_star,mlp_root_module")
    check(rc == 0 and len(rep["plans"]) == 3 and "verdict" in out, f"matrix of 3 plans: {rc}\n{out}")


FAULTS = [  # fault, model, plan, tp, expected localisation
    ("skip_all_reduce:layers.0.net2", "mlp_stacked", "mlp_stacked_multi_wildcard", 4, "forward `layers.0.net2` output"),
    ("bias_every_rank:layers.1.net2", "mlp_stacked", "mlp_stacked_multi_wildcard", 4, "forward `layers.1.net2` output"),
    ("skip_grad_all_reduce:layers.1.net1", "mlp_stacked", "mlp_stacked_multi_wildcard", 4,
     "backward `layers.1.net1` input gradient"),
    ("wrong_shard_dim:layers.0.net1", "mlp_stacked", "mlp_stacked_multi_wildcard", 2, "forward `layers.0.net1` output"),
    ("wrong_shard_offset:net1", "mlp", "mlp_colwise_replicate", 4, "forward `net1` output"),
    ("skip_all_reduce:net2", "mlp", "mlp_root_module", 4, None),  # net2 reduce-scatters: not an all_reduce
]


def faults():
    for fault, model, plan, tp, where in FAULTS:
        rc, out, rep = verify(model, plan, "--mesh", f"tp={tp}", env={"PTOOL_FAULT": fault})
        if where is None:
            # the fault names a reduction the plan does through reduce_scatter: still detected
            check(rc == 1 and "first divergence" in out, f"{fault}: exit {rc}\n{out}")
            continue
        check(rc == 1, f"{fault}: exit {rc} (want 1)\n{out}")
        check(rep is not None and where in rep["plans"][0]["localisation"], f"{fault}: localisation\n{out}")
    rc, out, _ = verify("mlp", "mlp_colwise_replicate", env={"PTOOL_FAULT": "no_such_fault:x"})
    check(rc == 2 and "PTOOL_FAULT" in out, f"bad PTOOL_FAULT: exit {rc}\n{out}")


BAD_PLANS = [  # plan text, message fragments (the first is file:line:column)
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    net1: colwize\n",
     [":5:11:", "unknown style 'colwize'", "did you mean 'colwise'"]),
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: pt\n  plan: {}\n", [":3:13:", "mesh_dim 'pt' is not a dim", "'tp'"]),
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    net1: {style: colwise, output_layouts: shard(x)}\n",
     [":5:", "is not a layout"]),
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  plann: {}\n", [":4:3:", "unknown key 'plann' in 'tensor_parallel' (did you mean 'plan'?)"]),
    ("mesh: {tp: 4, tp: 2}\n", [":1:", "duplicate key 'tp'"]),
    ("mesh: {tp: 0}\n", [":1:", "must be positive"]),
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  src_data_rank: 4\n  plan: {}\n", [":4:", "src_data_rank 4"]),
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    relu: colwise\n",
     [":5:5:", "'relu' matches 'relu', a relu: colwise applies to linear and embedding modules"]),
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    net*: colwise\n    net1: rowwise\n",
     [":6:5:", "both match 'net1'"]),
    ("mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    net1: {style: prepare_input, input_layouts: replicate}\n",
     [":5:", "needs input_layouts and desired_input_layouts"]),
    ("mesh: {tp: 4}\nverify: {compare: [output, gradient]}\n", [":2:", "unknown compare entry 'gradient' (valid: output, loss, grad, param)"]),
    ("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp, mode: replicat}\n", [":2:", "unknown mode 'replicat'", "did you mean 'replicate'"]),
    ("mesh: [4]\n", [":1:", "'mesh' must be a map"]),
    ("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    net1: sequence_parallel\n",
     [":5:5:", "'net1' matches 'net1', a linear: sequence_parallel applies to layer_norm, rms_norm and dropout"]),
]


def bad_plans():
    rc, out, _ = verify("gpt_block", "gpt_block_tp", "--mesh", "tp=8")
    check(rc == 2 and "attention 'attn_block.attn' splits its heads over 8 ranks: its 4 query heads" in out
          and "gpt_block_tp.yaml:8:5:" in out and "gpt_block.yaml:14:" in out,
          f"attention heads not divisible by tp: exit {rc}\n{out}")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (text, frags) in enumerate(BAD_PLANS):
            path = os.path.join(tmp, f"bad{i}.yaml")
            open(path, "w").write(text)
            rc, out, _ = verify("mlp", path)
            ok = rc == 2 and all(f in out for f in frags) and (path + frags[0]) in out
            check(ok, f"bad plan {i}: exit {rc}, want 2 with {frags}\n{out}")
    rc, out, _ = verify("gpt_block", "embedding_colwise", "--mesh", "tp=2")
    check(rc == 2 and "'wte' and 'lm_head' share one parameter: 'wte' (colwise) places it Shard(1) but 'lm_head' (unstyled) uses it whole" in out,
          f"colwise on a tied embedding, its head unstyled: exit {rc}\n{out}")
    # a norm fed sequence-sharded activations without sequence_parallel: its gradients are partial sums
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "nosp.yaml")
        open(path, "w").write("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    net1: colwise\n"
                              "    net2: {style: rowwise, output_layouts: shard(1)}\n")
        rc, out, rep = verify("seq_mlp", path)
        check(rc == 1 and "'norm2' (rms_norm) gets Shard(1) activations from 'net2'" in out
              and "step0.grad.norm2.weight" in [t["name"] for t in rep["plans"][0]["tensors"] if not t["pass"]],
              f"lint: norm on sequence shards without sequence_parallel: exit {rc}\n{out}")
    # a sharded activation fed to a module that needs whole rows: exit 2 before any rank starts
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lint.yaml")
        open(path, "w").write("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    layers.0.net1: colwise\n")
        rc, out, rep = verify("mlp_stacked", path)
        check(rc == 2 and "'layers.0.net1' outputs Shard(-1) but 'layers.0.net2' (linear) needs whole rows" in out
              and "mlp_stacked.yaml:13:" in out and "lint.yaml:5:5:" in out and "have 'layers.0.net1' output replicate" in out,
              f"lint: sharded output into a plain linear: exit {rc}\n{out}")


def mpi():
    args = ("--mesh", "tp=4")
    rc_t, out_t, threads = verify("mlp_stacked", "mlp_stacked_multi_wildcard", *args)
    rc_m, out_m, viampi = verify("mlp_stacked", "mlp_stacked_multi_wildcard", *args, mpi=4)
    check(rc_t == 0 and rc_m == 0, f"exit codes threads {rc_t}, mpi {rc_m}\n{out_m}")
    if threads and viampi:
        pt, pm = threads["plans"][0], viampi["plans"][0]
        check(pm["backend"] == "mpi" and pt["backend"] == "threads", "backends")
        same = [(a["name"], a["max_abs"], a["ulp"]) for a in pt["tensors"]] == \
               [(b["name"], b["max_abs"], b["ulp"]) for b in pm["tensors"]]
        check(same, "mpi and threads give different numbers")
    rc, out, _ = verify("mlp", "mlp_root_module", "--mesh", "tp=4", mpi=4, env={"PTOOL_FAULT": "wrong_shard_offset:net1"})
    check(rc == 1 and "first divergence: step 0 forward `net1` output" in out, f"mpi fault: exit {rc}\n{out}")
    rc, out, _ = verify("mlp", "mlp_root_module", "--mesh", "tp=2", mpi=4)
    check(rc == 2 and "the mesh has 2 ranks but mpirun started 4" in out, f"mpi world mismatch: exit {rc}\n{out}")


def explain():
    """explain's collectives per step (derived, no run) equal what verify measures, for every shipped plan."""
    cases = [(m, p) for m, p, _ in SEEDS] + [("gpt_block", "gpt_block_tp"), ("llama_block", "llama_block_tp"),
                                             ("seq_mlp", "seq_mlp_sp"), ("embedding_head", "embedding_colwise"),
                                             ("embedding_head", "embedding_rowwise"), ("gpt2_tied", "gpt2_tied_tp_sp"),
                                             ("llama_rope", "llama_rope_tp_sp")]
    for model, plan in cases:
        with tempfile.TemporaryDirectory() as tmp:
            ej = os.path.join(tmp, "e.json")
            p = subprocess.run([PTOOL, "explain", f"{ROOT}/models/{model}.yaml", f"{ROOT}/plans/{plan}.yaml", "--json", ej],
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


{"seeds": seeds, "faults": faults, "bad_plans": bad_plans, "mpi": mpi, "explain": explain}[GROUP]()
check.finish()
