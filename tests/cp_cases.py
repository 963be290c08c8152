#!/usr/bin/env python3
"""Context parallelism end to end (plans/llama_rope*_cp*.yaml, docs/plan_format.md).

    cp_cases.py PTOOL ROOT

- explain's collectives (each attention's key/value all_gathers and their gradients'
  reduce_scatters, or the ring's send/recv hops, per microbatch; the gradients' all_reduce over cp;
  fully_shard over dp x cp)
  equal, op by op in count and bytes, what verify measures on every shipped cp plan;
- under `mpirun -np WORLD` every shipped cp plan, DDP x the ring and pp x cp (ring and allgather) pass
  and give bitwise the same numbers as rank threads;
- what cannot split exits 2 at the plan's position: a sequence that does not cut into cp chunks (2 x
  cp load-balanced), a model without a sequence dim, a rotate_method torch does not have;
- fully_shard over dp x cp of rows that do not cut evenly (tests/data/models/qwen_vocab97.yaml: 97
  rows over 4) passes as FSDP2 over the flattened dp_shard_cp group chunks them (threads and mpirun
  alike, the tensors fully_shard over dp 4 compares), explain prices each rank's shards as dp 4's,
  and faults on it fail localised where they are under dp 4;
- the ring (rotate_method alltoall) and allgather both pass on the same mesh, comparing the same
  tensors;
- a gradient out of step on one cp rank under a clip that acts is localised to it (its copies
  differ before clip_grad_norm), not to the first gradient the clip scaled; a fully_shard unit's
  gradients (or one gradient 0.1% off) under a clip that acts, to the unit's first gradient past
  the factor the clip gives every gradient.
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


def run(*args, mpi=0):
    cmd = [PTOOL, *args]
    if mpi:
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(mpi)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    return p.returncode, p.stdout + p.stderr


def model_of(plan):
    return re.search(r"models/[a-z_0-9]*\.yaml", open(plan).read()).group(0)


plans = sorted(p for p in glob.glob(f"{ROOT}/plans/*.yaml") if "context_parallel:" in open(p).read())
check(len(plans) >= 5, f"{len(plans)} shipped context parallel plans")

with tempfile.TemporaryDirectory() as tmp:
    # explain's collectives are verify's
    for plan in plans:
        name = os.path.basename(plan)[:-5]
        ej, vj = os.path.join(tmp, f"{name}_e.json"), os.path.join(tmp, f"{name}_v.json")
        rc_e, out_e = run("explain", model_of(plan), plan, "--json", ej)
        rc_v, out_v = run("verify", model_of(plan), plan, "--steps", "1", "--json", vj, "-q")
        if not check(rc_e == 0 and rc_v == 0, f"{name}: explain rc {rc_e}, verify rc {rc_v}\n{out_e[-400:]}{out_v[-800:]}"):
            continue
        derived, measured = {}, {}
        for c in json.load(open(ej))["collectives_per_step"]:
            d = derived.setdefault(c["op"], [0, 0])
            d[0], d[1] = d[0] + 1, d[1] + c["bytes"]
        for c in json.load(open(vj))["plans"][0]["collectives"]["steps"]:
            m = measured.setdefault(c["op"], [0, 0])
            m[0], m[1] = m[0] + c["calls"], m[1] + c["bytes"]
        check(derived == measured, f"{name}: explain derives {derived}, verify measured {measured}")
        check("cp" in {c["mesh_dim"] for c in json.load(open(vj))["plans"][0]["collectives"]["steps"]}
              or "dp+cp" in {c["mesh_dim"] for c in json.load(open(vj))["plans"][0]["collectives"]["steps"]},
              f"{name}: no collective over cp")

    # compositions not shipped as plans: DDP x the ring, pp x the ring (and x allgather)
    compositions = {
        "ddp_ring": "mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp}\n"
                    "context_parallel: {mesh_dim: cp, rotate_method: alltoall}\n",
        "pp_ring": "mesh: {pp: 2, cp: 2}\npipeline_parallel: {mesh_dim: pp, split_points: [layers.1]}\n"
                   "context_parallel: {mesh_dim: cp, rotate_method: alltoall}\n",
        "pp_allgather": "mesh: {pp: 2, cp: 2}\npipeline_parallel: {mesh_dim: pp, split_points: [layers.1]}\n"
                        "context_parallel: {mesh_dim: cp}\n",
    }
    composed = []
    for name, text in compositions.items():
        path = os.path.join(tmp, f"{name}.yaml")
        open(path, "w").write("# models/llama_rope.yaml\n" + text)
        composed.append(path)

    # mpirun: the same verdict and numbers as threads, every shipped cp plan and the compositions
    for plan in [os.path.relpath(p, ROOT) for p in plans] + composed:
        name = os.path.basename(plan)[:-5]
        reports = {}
        path = plan if os.path.isabs(plan) else f"{ROOT}/{plan}"
        world = 1
        for n in re.search(r"^mesh: \{(.*)\}", open(path).read(), re.M).group(1).split(","):
            world *= int(n.split(":")[1])
        for mpi in (0, world):
            out = os.path.join(tmp, f"{name}_{mpi}.json")
            rc, text = run("verify", model_of(path), plan, "--json", out, "-q", mpi=mpi)
            check(rc == 0, f"{name} (mpi {mpi}): exit {rc}\n{text[-800:]}")
            if os.path.exists(out):
                reports[mpi] = json.load(open(out))["plans"][0]
        if len(reports) == 2:
            check(reports[world]["backend"] == "mpi", f"{name}: backend {reports[world]['backend']}")
            values = {m: {t["name"]: (t["max_abs"], t["replicas"]) for t in r["tensors"]} for m, r in reports.items()}
            check(values[0] == values[world] and len(values[0]) > 100, f"{name}: threads and mpi differ")

    # the ring and allgather on the same mesh: both pass, on the same tensors
    ring, gather = {}, {}
    for rotate, into in (("alltoall", ring), ("allgather", gather)):
        path = os.path.join(tmp, f"rot_{rotate}.yaml")
        open(path, "w").write(f"mesh: {{cp: 4}}\ncontext_parallel: {{rotate_method: {rotate}}}\n")
        out = os.path.join(tmp, f"rot_{rotate}.json")
        rc, text = run("verify", "models/llama_rope.yaml", path, "--json", out, "-q")
        check(rc == 0, f"{rotate}: exit {rc}\n{text[-600:]}")
        if os.path.exists(out):
            into.update({t["name"]: t["max_abs"] for t in json.load(open(out))["plans"][0]["tensors"]})
    check(ring.keys() == gather.keys() and len(ring) > 100, f"ring and allgather compare {len(ring)} and {len(gather)} tensors")

    # refusals: exit 2 at the plan's context_parallel
    def refused(model, plan_text, *args, want):
        path = os.path.join(tmp, "bad.yaml")
        open(path, "w").write(plan_text)
        rc, out = run("verify", model, path, *args)
        check(rc == 2 and re.search(rf"bad\.yaml:\d+:\d+: .*{want}", out), f"{plan_text!r} {args}: exit {rc}\n{out[-600:]}")

    refused("models/llama_rope.yaml", "mesh: {cp: 3}\ncontext_parallel: {}\n",
            want=r"the sequence of 8 tokens does not cut into 6 equal chunks")
    refused("models/llama_rope.yaml", "mesh: {cp: 2}\ncontext_parallel: {}\n", "--mesh", "cp=8",
            want=r"does not cut into 16 equal chunks")
    refused("models/mlp.yaml", "mesh: {cp: 2}\ncontext_parallel: {}\n",
            want=r"context_parallel splits the sequence \(dim 1\)")
    refused("models/llama_rope.yaml", "mesh: {cp: 2}\ncontext_parallel: {rotate_method: ring}\n",
            want=r"rotate_method 'ring'")
    # fully_shard over dp 2 x cp 2 of rows that do not cut evenly (was exit 2): FSDP2 chunks them over
    # the flattened dp_shard_cp group as over a 1-D mesh of 4 (97 rows: 25, 25, 25, 22). The plan
    # passes, under threads and mpirun alike; every parameter and gradient is compared with the
    # reference as under fully_shard over dp 4; explain prices each rank's shards as dp 4's; each fault
    # fails and is localised to the tensor it is under dp 4.
    uneven = f"{ROOT}/tests/data/models/qwen_vocab97.yaml"
    fsdp4, fsdp_cp = os.path.join(tmp, "fsdp4.yaml"), os.path.join(tmp, "fsdp_cp.yaml")
    open(fsdp4, "w").write("mesh: {dp: 4}\ndata_parallel: {mesh_dim: dp, mode: fully_shard, fully_shard: [\"model.layers.*\"]}\n")
    open(fsdp_cp, "w").write("mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard, "
                             "fully_shard: [\"model.layers.*\"]}\ncontext_parallel: {mesh_dim: cp}\n")
    compared = {}
    for plan, mpi in ((fsdp4, 0), (fsdp_cp, 0), (fsdp_cp, 4)):
        out = os.path.join(tmp, f"uneven_{os.path.basename(plan)}_{mpi}.json")
        rc, text = run("verify", uneven, plan, "--json", out, "-q", mpi=mpi)
        if check(rc == 0 and os.path.exists(out), f"uneven {os.path.basename(plan)} (mpi {mpi}): exit {rc}\n{text[-800:]}"):
            compared[(plan, mpi)] = {t["name"]: (t["max_abs"], t["replicas"]) for t in json.load(open(out))["plans"][0]["tensors"]}
    if len(compared) == 3:
        names = {p: set(t) for p, t in compared.items()}
        check(names[(fsdp4, 0)] == names[(fsdp_cp, 0)] and len(names[(fsdp4, 0)]) > 100
              and "step1.param.model.embed_tokens.weight" in names[(fsdp_cp, 0)],
              f"uneven: fsdp over dp x cp compares {len(names[(fsdp_cp, 0)])} tensors, over dp 4 {len(names[(fsdp4, 0)])}")
        check(compared[(fsdp_cp, 0)] == compared[(fsdp_cp, 4)], "uneven fsdp over dp x cp: threads and mpi differ")
    # explain: exit 0, and each rank's parameters are its shards, as under dp 4 (rank 3: 22 of the
    # embedding's 97 rows, 3 x 48 x 4 B fewer than ranks 0 to 2)
    params = {}
    for plan in (fsdp4, fsdp_cp):
        ej = os.path.join(tmp, f"uneven_{os.path.basename(plan)}_e.json")
        rc, text = run("explain", uneven, plan, "--json", ej)
        if check(rc == 0, f"explain uneven {os.path.basename(plan)}: exit {rc}\n{text[-600:]}"):
            params[plan] = {r: c["allocated_at_peak"]["parameters"] for c in json.load(open(ej))["memory"] for r in c["ranks"]}
    if len(params) == 2:
        p = params[fsdp_cp]
        check(p == params[fsdp4] and sorted(p) == [0, 1, 2, 3] and p[0] == p[1] == p[2] == p[3] + 3 * 48 * 4,
              f"explain's parameters per rank: over dp x cp {p}, over dp 4 {params[fsdp4]}")
    # faults on the uneven plan: each fails, localised where it is under fully_shard over dp 4 (no clip
    # acting here: a clip scales every gradient after the first that differs)
    noclip = os.path.join(tmp, "qwen_noclip.yaml")
    open(noclip, "w").write(open(uneven).read().replace("clip_grad_norm: 0.5", "clip_grad_norm: 100.0"))
    for fault, want in (("grad_scale:model.embed_tokens.weight", "step 0 gradient of `model.embed_tokens.weight`"),
                        ("grad_scale:model.layers.1.mlp.down_proj.weight", "step 0 gradient of `model.layers.1.mlp.down_proj.weight`"),
                        ("skip_reduce_scatter:model.layers.0", "step 0 gradient of `model.layers.0."),
                        ("stale_param:model.layers.1", "step 1 forward `model.layers.1.")):
        firsts = {}
        for plan in (fsdp4, fsdp_cp):
            p = subprocess.run([PTOOL, "verify", noclip, plan], capture_output=True, text=True, timeout=300, cwd=ROOT,
                               env=dict(os.environ, PTOOL_FAULT=fault))
            first = re.search(r"first divergence: (.*?),", p.stdout)
            firsts[plan] = first.group(1) if first else None
            check(p.returncode == 1 and firsts[plan] and firsts[plan].startswith(want),
                  f"{fault} on {os.path.basename(plan)}: exit {p.returncode}, first divergence {firsts[plan]}\n{p.stdout[-600:]}")
        check(firsts[fsdp4] == firsts[fsdp_cp], f"{fault}: over dp 4 {firsts[fsdp4]}, over dp x cp {firsts[fsdp_cp]}")

    # a gradient out of step on one cp rank under a clip that acts (norm above clip_grad_norm): each
    # group of copies clips by its own norm, so every gradient after the clip differs; localisation
    # names the one whose copies differed before it (was: the first gradient in registration order)
    clipped = os.path.join(tmp, "llama_clip.yaml")
    open(clipped, "w").write(open(f"{ROOT}/models/llama_rope.yaml").read().replace(
        "clip_grad_norm: 1.0", "clip_grad_norm: 0.01"))
    mlp = "layers.1.ffn_block.feed_forward.down_proj.weight"
    before_clip = ": its copies differ across replicas before clip_grad_norm"
    # (fully_shard over dp x cp: the copies are one, synced after the fault; named by its error)
    for plan, broken, how in (("plans/llama_rope_cp2.yaml", mlp, before_clip),
                              ("plans/llama_rope_cp2.yaml", "layers.0.attn_block.attention_norm.weight", before_clip),
                              ("plans/llama_rope_fsdp_cp.yaml", mlp, ", error")):
        p = subprocess.run([PTOOL, "verify", clipped, plan], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env=dict(os.environ, PTOOL_FAULT=f"grad_scale:{broken}"))
        check(p.returncode == 1 and f"first divergence: step 0 gradient of `{broken}`{how}" in p.stdout,
              f"{plan} {broken}: exit {p.returncode}\n{p.stdout[-800:]}")

    # a fully_shard unit's gradients wrong (its reduce_scatter skipped) or one gradient 0.1% off under
    # a clip that acts (llama_sft's norm 0.92 over 0.05): the norms part, so each run scales every
    # gradient by another factor and every gradient differs; localisation names the first gradient
    # that parts by more than rounding past the factor they share (was: tok_embeddings, the first)
    sft_clip = os.path.join(tmp, "llama_sft_clip.yaml")
    open(sft_clip, "w").write(open(f"{ROOT}/models/llama_sft.yaml").read().replace(
        "clip_grad_norm: 1.0", "clip_grad_norm: 0.05"))
    hsdp = os.path.join(tmp, "sft_hsdp.yaml")
    open(hsdp, "w").write("mesh: {dp_replicate: 2, dp_shard: 2}\ndata_parallel: {mesh_dim: [dp_replicate, dp_shard], "
                          "mode: fully_shard, fully_shard: [\"layers.*\"]}\n")
    past = "`: past the factor"
    for plan, fault, named in (("plans/llama_sft_fsdp_cp.yaml", "skip_reduce_scatter:layers.1", "layers.1."),
                               ("plans/llama_sft_fsdp_cp.yaml", "skip_reduce_scatter:layers.0", "layers.0."),
                               (hsdp, "skip_reduce_scatter:layers.1", "layers.1."),
                               ("plans/llama_sft_fsdp_cp.yaml", "grad_scale:output.weight", "output.weight")):
        p = subprocess.run([PTOOL, "verify", sft_clip, plan], capture_output=True, text=True, timeout=300, cwd=ROOT,
                           env=dict(os.environ, PTOOL_FAULT=fault))
        line = next((l for l in p.stdout.splitlines() if "first divergence" in l), "")
        check(p.returncode == 1 and f"first divergence: step 0 gradient of `{named}" in line and past in line,
              f"{plan} {fault} under an acting clip: exit {p.returncode}\n{line}\n{p.stdout[-600:]}")
    p = subprocess.run([PTOOL, "verify", sft_clip, "plans/llama_sft_fsdp_cp.yaml", "-q"], capture_output=True, text=True,
                       timeout=300, cwd=ROOT)
    check(p.returncode == 0, f"llama_sft under an acting clip, fsdp x cp: exit {p.returncode}\n{p.stdout[-600:]}")

    # most gradients wrong: a pipeline whose stage 0 (25 of the 27 gradients) scales its gradients
    # twice. The factor clip_grad_norm puts between the runs is the ratio of their coefficients, from
    # the two recorded norms; a median of the gradients' own factors was the faulty stage's (0.27),
    # and the right stage's norm.weight was named past it
    pp_norm = os.path.join(tmp, "sft_pp2_norm.yaml")
    open(pp_norm, "w").write("mesh: {pp: 2}\npipeline_parallel: {mesh_dim: pp, split_points: [norm], microbatches: 2}\n")
    p = subprocess.run([PTOOL, "verify", sft_clip, pp_norm], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env=dict(os.environ, PTOOL_FAULT="pp_grad_scaled_twice:0"))
    line = next((l for l in p.stdout.splitlines() if "first divergence" in l), "")
    check(p.returncode == 1 and "first divergence: step 0 gradient of `tok_embeddings.weight`" in line,
          f"stage 0's gradients scaled twice under an acting clip: exit {p.returncode}\n{line}\n{p.stdout[-600:]}")

check.finish()
