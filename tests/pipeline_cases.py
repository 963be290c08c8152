#!/usr/bin/env python3
"""End-to-end pipeline-parallel cases of `ptool verify`, run by ctest.

    pipeline_cases.py PTOOL ROOT

Every plan under tests/data/pipeline/ (each names its model in its header: models/ or
tests/data/models/; interleaved 1F1B among them) passes against the single-device reference with
the same microbatches, with every tensor compared; its golden
(recorded from that reference) replays; injected bugs in a stage (a gradient scaled, DDP's buckets
skipped, a tied weight's gradient not summed) fail and name the tensor; pipeline_parallel's schema
errors exit 2 with file:line:column and the message; under mpirun a pipeline plan is refused
(exit 2), not half-verified.
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

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()
PLANS = sorted(glob.glob(f"{ROOT}/tests/data/pipeline/*.yaml"))


def model_of(plan):
    return f"{ROOT}/" + re.search(r"(tests/data/)?models/[a-z_0-9]+\.yaml", open(plan).read()).group(0)


def run(*args, env=None, timeout=300):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def verify(plan, *args, env=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        rc, text = run("verify", model_of(plan), plan, "--json", out, "-q", *args, env=env)
        return rc, text, json.load(open(out)) if os.path.exists(out) else None


check(len(PLANS) >= 10, f"tests/data/pipeline has {len(PLANS)} plans")
for plan in PLANS:
    name = os.path.basename(plan)
    rc, text, rep = verify(plan)
    check(rc == 0 and rep is not None and rep["pass"], f"{name}: exit {rc}\n{text[-2000:]}")
    if "pp: 1}" not in open(plan).read():  # one pp rank holding every stage sends nothing
        check("recv x" in text and "send x" in text, f"{name}: no send/recv counted\n{text[-800:]}")
    with tempfile.TemporaryDirectory() as tmp:
        g = os.path.join(tmp, "g.safetensors")
        rc, text = run("golden", "record", model_of(plan), plan, "-o", g)
        check(rc == 0, f"{name}: golden record exit {rc}\n{text[-800:]}")
        rc, text = run("verify", g, "-q")
        check(rc == 0 and "1 passed" in text, f"{name}: golden replay exit {rc}\n{text[-800:]}")

# injected bugs fail and name what they break
FAULTS = [
    ("mlp_pp2_ddp_layers.yaml", "skip_bucket:*", "grad.layers."),
    ("mlp_pp2_ddp_layers.yaml", "grad_scale:layers.1.net2.weight", "layers.1.net2.weight"),
    ("gpt2_tied_pp2_gpipe.yaml", "tied_grad:*", "step0."),
    ("mlp_pp2_dp2_tp2_fsdp.yaml", "skip_reduce_scatter:layers.1", "layers.1."),
    # interleaved: a block of the last rank's first stage (1), DDP on both of its stages, the tied head's sum
    ("mlp8_pp2_v2_ddp.yaml", "grad_scale:layers.3.net2.weight", "layers.3.net2.weight"),
    ("mlp8_pp2_v2_ddp.yaml", "skip_bucket:*", "grad.layers."),
    ("gpt2_tied_pp2_v2.yaml", "tied_grad:*", "step0."),
    ("mlp8_pp2_v2_dp2_tp2_fsdp.yaml", "skip_reduce_scatter:layers.4", "layers.4."),
]
for plan, fault, names in FAULTS:
    rc, text, rep = verify(f"{ROOT}/tests/data/pipeline/{plan}", env={"PTOOL_FAULT": fault})
    check(rc == 1 and names in text, f"{plan} with {fault}: exit {rc}, expected 1 naming {names}\n{text[-1500:]}")

# schema errors
BAD = [
    ("mesh: {pp: 2}\npipeline_parallel: {schedule: zb}\n", ":2:", "unknown schedule 'zb'"),
    ("mesh: {pp: 2}\npipeline_parallel: {microbatches: 1}\n", ":2:", "1 microbatches < 2 stages"),
    ("mesh: {pp: 2}\npipeline_parallel: {split_points: [layers.1, norm]}\n", ":2:",
     "2 split points make 3 stages, but the pipeline has 2"),
    ("mesh: {pp: 2}\npipeline_parallel: {split_points: [a], layers_per_stage: 1}\n", ":2:",
     "'layers_per_stage' and 'split_points' both cut the stages"),
    ("mesh: {pp: 2, tp: 2}\npipeline_parallel: {microbatches: 2}\n", ":2:", "'pipeline_parallel' needs 'mesh_dim'"),
    ("mesh: {pp: 2}\ntensor_parallel: {plan: {}}\npipeline_parallel: {mesh_dim: pp}\n", ":3:",
     "pipeline_parallel and tensor_parallel both use mesh dim 'pp'"),
    ("mesh: {pp: 2}\npipeline_parallel: {virtual_stages: 2}\n", ":2:", "virtual_stages 2 needs schedule interleaved_1f1b"),
    ("mesh: {pp: 4}\npipeline_parallel: {schedule: interleaved_1f1b, microbatches: 6}\n", ":2:",
     "6 microbatches is no multiple of 4"),
    ("mesh: {pp: 2}\npipeline_parallel: {split_points: [layers.7]}\n", ":2:", "split point 'layers.7' is not a module"),
    ("mesh: {pp: 2}\npipeline_parallel: {layers_per_stage: 3}\n", ":2:", "layers_per_stage 3 x 2 stages is 6 blocks"),
    ("mesh: {pp: 2}\npipeline_parallel: {microbatches: 5}\n", ":2:", "do not cut into 5 microbatches"),
    ("mesh: {pp: 2}\npipeline_parallel: {microbatches: 2, stages: 2}\n", ":2:", "stages"),
]
with tempfile.TemporaryDirectory() as tmp:
    for i, (text, where, message) in enumerate(BAD):
        path = os.path.join(tmp, f"bad{i}.yaml")
        open(path, "w").write(text)
        rc, out = run("verify", f"{ROOT}/models/mlp_stacked_mse.yaml", path, "-q")
        check(rc == 2 and f"bad{i}.yaml{where}" in out and message in out,
              f"{text!r}: exit {rc}, expected 2 at {where} with {message!r}\n{out[-600:]}")

# under mpirun: refused, not half-verified
if subprocess.run(["which", "mpirun"], capture_output=True).returncode == 0:
    plan = f"{ROOT}/tests/data/pipeline/mlp_pp2_ddp_layers.yaml"
    p = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "4", PTOOL, "verify",
                        model_of(plan), plan, "-q"], capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    check(p.returncode == 2 and "is verified in rank threads" in out, f"mpirun: exit {p.returncode}\n{out[-800:]}")

check.finish()
