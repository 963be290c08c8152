#!/usr/bin/env python3
"""End-to-end pipeline-parallel cases of `ptool verify`, run by ctest.

    pipeline_cases.py PTOOL ROOT

Every plan under tests/data/pipeline/ (each names its model in its header: models/ or
tests/data/models/; interleaved 1F1B among them) passes against the single-device reference with
the same microbatches, with every tensor compared; its golden
(recorded from that reference) replays; injected bugs in a stage (a gradient scaled, DDP's buckets
skipped, a tied weight's gradient not summed, and pipeline faults: an activation sent for the wrong
microbatch, a boundary gradient not sent, a tied weight's cross-stage sum or one stage's
gradient sync skipped) fail and name the tensor or the first divergence; the mutation score
(tests/mutation_score.py) runs every pipeline fault class over every case; pipeline_parallel's schema
errors exit 2 with file:line:column and the message; under mpirun -np WORLD each plan passes with
the thread run's per-tensor verdicts, a gradient scaled on stage 1 fails there too, and
`--golden` compares three ways there (a golden with a stage-1 gradient moved fails naming it).
"""
import glob
import json
import os
import re
import struct
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
    ("mlp_pp2_ddp_layers.yaml", "pp_wrong_activation:0", "first divergence: step 0 forward `layers.1."),
    ("llama_rope_pp2_tp2_sp.yaml", "pp_detached_input:1", "first divergence: step 0 backward `layers.0."),
    ("gpt2_tied_pp2_gpipe.yaml", "pp_tied_unsynced:wte.weight", "first divergence: step 0 gradient of `wte.weight`"),
    ("mlp_pp2_dp2_tp2_fsdp.yaml", "pp_stage_sync_skipped:1", "first divergence: step 0 gradient of `layers.1."),
    # interleaved: a block of the last rank's first stage (1), DDP on both of its stages, the tied head's sum
    ("mlp8_pp2_v2_ddp.yaml", "grad_scale:layers.3.net2.weight", "layers.3.net2.weight"),
    ("mlp8_pp2_v2_ddp.yaml", "skip_bucket:*", "grad.layers."),
    ("gpt2_tied_pp2_v2.yaml", "tied_grad:*", "step0."),
    ("mlp8_pp2_v2_dp2_tp2_fsdp.yaml", "skip_reduce_scatter:layers.4", "layers.4."),
    # interleaved: a pipeline fault acts on the stage it names, not on the rest of its rank's
    # (stage 1 of 8 on pp rank 1, which also holds stage 5; stage 2 of 4 on rank 0 beside stage 0)
    ("mlp8_pp4_v2.yaml", "pp_wrong_activation:1", "first divergence: step 0 forward `layers.2."),
    ("mlp8_pp4_v2.yaml", "pp_stale_activation:5", "first divergence: step 0 gradient of `layers.5."),
    ("mlp8_pp2_v2_ddp.yaml", "pp_grad_scaled_twice:2", "first divergence: step 0 gradient of `layers.4."),
    ("mlp8_pp2_v2_dp2_tp2_fsdp.yaml", "pp_stage_sync_skipped:3", "first divergence: step 0 gradient of `layers.6."),
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

# under mpirun (one process per rank, each stage's leader sending its whole tensors to rank 0):
# every plan passes with the thread run's verdicts, tensor for tensor, and a fault in a later stage
# fails there as it does in rank threads
def verdicts(rep):
    """Each plan's tensors by name: whether it passed and how its replicas agreed."""
    return {t["name"]: (t["pass"], t["replicas"]) for p in rep["plans"] for t in p["tensors"]}


def verify_mpi(plan, world, env=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        p = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(world), PTOOL, "verify",
                            model_of(plan), plan, "--json", out, "-q"], capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, **(env or {})))
        return p.returncode, p.stdout + p.stderr, json.load(open(out)) if os.path.exists(out) else None


if subprocess.run(["which", "mpirun"], capture_output=True).returncode == 0:
    MPI_FAULT = ("mlp_pp2_ddp_layers.yaml", "grad_scale:layers.1.net2.weight", "step0.grad.layers.1.net2.weight")
    for plan in PLANS:
        name = os.path.basename(plan)
        for fault in (None, MPI_FAULT[1]) if name == MPI_FAULT[0] else (None,):
            env = {"PTOOL_FAULT": fault} if fault else None
            rc_t, text_t, threads = verify(plan, env=env)
            if threads is None:
                check(False, f"{name} {fault}: no thread report (exit {rc_t})\n{text_t[-800:]}")
                continue
            world = threads["plans"][0]["world_size"]
            rc, text, rep = verify_mpi(plan, world, env=env)
            expect = 1 if fault else 0
            check(rc == expect == rc_t and rep is not None and rep["pass"] == (not fault),
                  f"{name} {fault or ''} under mpirun -np {world}: exit {rc} (threads {rc_t}), expected {expect}\n"
                  f"{text[-2000:]}")
            if rep is None:
                continue
            check(rep["plans"][0]["backend"] == "mpi", f"{name}: backend {rep['plans'][0]['backend']}")
            a, b = verdicts(threads), verdicts(rep)
            check(len(a) == len(b) and len(a) > 10, f"{name} {fault or ''}: {len(b)} tensors under mpirun, {len(a)} in threads")
            differ = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
            check(not differ, f"{name} {fault or ''}: mpirun and threads judge differently: "
                  + ", ".join(f"{n} {b.get(n)} vs {a.get(n)}" for n in differ[:8]))
            for key in ("localisation", "divergence"):  # from the module events of both stages
                check(rep["plans"][0][key] == threads["plans"][0][key],
                      f"{name} {fault or ''}: {key} under mpirun {rep['plans'][0][key]!r}, "
                      f"in threads {threads['plans'][0][key]!r}")
            if fault:
                failed = sorted(n for n, (ok, _) in b.items() if not ok)
                check(MPI_FAULT[2] in failed and MPI_FAULT[2] in text,
                      f"{name} with {fault} under mpirun: fails {failed[:6]}, not naming {MPI_FAULT[2]}\n{text[-1500:]}")

    # three ways under mpirun (parallel vs reference, vs a golden, reference vs the golden): the
    # golden ptool records passes; one element of a stage-1 gradient in it moved by half fails both
    # golden comparisons naming that gradient (rank 0 compares stage 1's tensors with the golden)
    plan = f"{ROOT}/tests/data/pipeline/mlp_pp2_ddp_layers.yaml"
    moved = "step0.grad.layers.1.net2.weight"
    with tempfile.TemporaryDirectory() as tmp:
        g, bad = os.path.join(tmp, "g.safetensors"), os.path.join(tmp, "moved.safetensors")
        rc, text = run("golden", "record", model_of(plan), plan, "-o", g)
        check(rc == 0, f"golden record exit {rc}\n{text[-800:]}")
        data = bytearray(open(g, "rb").read())
        n = struct.unpack("<Q", data[:8])[0]
        info = json.loads(data[8:8 + n])[moved]
        check(info["dtype"] == "F32", f"{moved} is {info['dtype']}")
        at = 8 + n + info["data_offsets"][0]
        data[at:at + 4] = struct.pack("<f", struct.unpack("<f", data[at:at + 4])[0] * 1.5 + 1.0)
        open(bad, "wb").write(bytes(data))
        for golden, expect in ((g, 0), (bad, 1)):
            p = subprocess.run(["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", "4", PTOOL, "verify",
                                model_of(plan), plan, "--golden", golden], capture_output=True, text=True, timeout=600)
            out = p.stdout + p.stderr
            verdict = "PASS" if expect == 0 else "FAIL"
            check(p.returncode == expect and "parallel vs reference: PASS" in out
                  and f"reference vs golden: {verdict}" in out and f"parallel vs golden: {verdict}" in out
                  and (expect == 0 or f"parallel vs golden: {moved}" in out),
                  f"mpirun --golden {os.path.basename(golden)}: exit {p.returncode}, expected {expect}\n{out[-1500:]}")

check.finish()
