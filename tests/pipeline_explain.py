#!/usr/bin/env python3
"""explain of pipeline plans, held to what verify measures, run by ctest.

    pipeline_explain.py PTOOL ROOT

For every plan under tests/data/pipeline/ (each names its model in its header):
- each pipeline stage is its own rank class, and explain's predicted peak of every rank equals
  the peak `verify --json` measures on that rank, to the byte (docs/planning.md, memory per stage;
  the steady state's, or the first step's when verify runs one step);
- explain's pipeline section names every stage, its ranks (each rank in the stages it runs), its
  first and last spine module, the microbatches it holds at once under its schedule (GPipe: a
  round's; 1F1B: at most pp - s; a split backward's to its W), and its pp rank's sends and receives per step (one per microbatch
  and boundary of the rank's stages; of two stages, one sends what the other receives);
- with a cluster, every rank class's step is the schedule's critical path (the same for every
  class), at least the class's own compute, with a bubble above 0 where there are two pp ranks or
  more;
- the documents match docs/schema/.
- the last stage holds every microbatch's output to the step's end, as torch.distributed.pipelining's
  stage does (`output_chunks`): in the compute dtype under mixed precision too, where ptool's own
  kept copy is in the model's (its growth from 2 to 8 microbatches was 0).
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
PLANS = sorted(glob.glob(f"{ROOT}/tests/data/pipeline/*.yaml"))
CLUSTER = f"{ROOT}/clusters/cpu_local.yaml"


def model_of(plan):
    return f"{ROOT}/" + re.search(r"(tests/data/)?models/[a-z_0-9]+\.yaml", open(plan).read()).group(0)


check(len(PLANS) >= 4, f"tests/data/pipeline has {len(PLANS)} plans")
with tempfile.TemporaryDirectory() as tmp:
    for plan in PLANS:
        name = os.path.basename(plan)
        ej, vj = os.path.join(tmp, "e.json"), os.path.join(tmp, "v.json")
        p = subprocess.run([PTOOL, "explain", model_of(plan), plan, "--json", ej, "--cluster", CLUSTER],
                           capture_output=True, text=True, timeout=120)
        q = subprocess.run([PTOOL, "verify", model_of(plan), plan, "--json", vj, "-q"], capture_output=True, text=True,
                           timeout=300)
        if not check(p.returncode == 0 and q.returncode == 0, f"{name}: explain exit {p.returncode}, verify exit "
                     f"{q.returncode}\n{p.stderr}{q.stdout[-800:]}{q.stderr}"):
            continue
        for doc, kind in ((ej, "explain"), (vj, "verify")):
            err = validate_file(doc, kind)
            check(err is None, f"{name}: {err}")
        e, v = json.load(open(ej)), json.load(open(vj))
        check("\n  pipeline (" in p.stdout, f"{name}: explain prints no pipeline section\n{p.stdout[:1500]}")

        # explain simulates at least two steps: a 1-step verify is held to the first step's peak
        key = "first_step_peak_bytes" if e["verify_steps"] == 1 else "predicted_peak_bytes"
        predicted = {r: m[key] for m in e["memory"] for r in m["ranks"]}
        measured = {m["rank"]: m["measured_peak_bytes"] for m in v["plans"][0]["memory"]}
        check(sorted(predicted) == sorted(measured), f"{name}: classes cover {sorted(predicted)}, verify ran {sorted(measured)}")
        for rank, meas in sorted(measured.items()):
            check(predicted.get(rank) == meas, f"{name} rank {rank}: predicted {predicted.get(rank)} B, measured {meas} B")

        pipe = e.get("pipeline")
        if not check(pipe is not None, f"{name}: explain --json has no pipeline"):
            continue
        stages = pipe["stages"]
        ranks = sorted(r for s in stages for r in s["ranks"])
        v = pipe["virtual_stages"]
        check(ranks == sorted(list(measured) * v), f"{name}: the stages' ranks {ranks} are not every rank in {v} stages")
        classes = [set(m["ranks"]) for m in e["memory"]]
        for s in stages:  # a class never spans two stages
            check(all(c <= set(s["ranks"]) or not (c & set(s["ranks"])) for c in classes),
                  f"{name}: a rank class spans stage {s['stage']} and another: {classes}")
        m, rounds, n, v = pipe["microbatches"], pipe["rounds"], len(stages), pipe["virtual_stages"]
        pp = n // v
        per_step = m * rounds  # one activation forward and one gradient back per microbatch and boundary
        for s in stages:
            k = s["stage"]
            if pipe["schedule"] in ("zero_bubble", "zbv", "dualpipev"):  # to each microbatch's W
                check(1 <= s["in_flight"] <= m * v, f"{name} stage {k}: {s['in_flight']} microbatches in flight")
            elif pipe["schedule"] != "interleaved_1f1b":
                want = m if pipe["schedule"] == "gpipe" else min(n - k, m)
                check(s["in_flight"] == want, f"{name} stage {k}: {s['in_flight']} microbatches in flight, expected {want}")
            else:  # a rank holds at most a round of microbatches per stage it runs
                check(1 <= s["in_flight"] <= m * v, f"{name} stage {k}: {s['in_flight']} microbatches in flight")
            # the sends and receives of the stage's pp rank: each boundary of its stages to a stage of
            # another rank (the loop places stage j on rank j mod pp; the V of zbv and dualpipev j and
            # 2 pp - 1 - j on rank j, so its last rank hands stage pp - 1's output on to stage pp)
            v_placed = pipe["schedule"] in ("zbv", "dualpipev")
            place = [min(j, n - 1 - j) if v_placed else j % pp for j in range(n)]
            boundaries = sum((j + 1 < n and place[j + 1] != place[j]) + (j > 0 and place[j - 1] != place[j])
                             for j in range(n) if place[j] == place[k])
            check(s["sends"] == per_step * boundaries and s["recvs"] == s["sends"],
                  f"{name} stage {k}: {s['sends']} sends, {s['recvs']} receives for {per_step} microbatches, "
                  f"{boundaries} boundaries")
        if n == 2:  # what one stage sends on, the other receives
            a, b = stages
            check(a["send_bytes"] == b["recv_bytes"] and a["recv_bytes"] == b["send_bytes"],
                  f"{name}: stage 0 sends {a['send_bytes']} B, receives {a['recv_bytes']} B; stage 1 receives "
                  f"{b['recv_bytes']} B, sends {b['send_bytes']} B")
        # the uniform-stage bubble: the closed form (p-1)/(v m) where the backward is one piece; a split
        # backward's Ws fill some of it (each of these short rounds idles less than 1F1B's, more than none)
        closed = (pp - 1) / (pipe["virtual_stages"] * m)
        if pipe["schedule"] in ("zero_bubble", "zbv", "dualpipev"):
            check(0 < pipe["bubble_closed_form"] < closed, f"{name}: uniform bubble {pipe['bubble_closed_form']} vs {closed}")
        else:
            check(abs(pipe["bubble_closed_form"] - closed) < 1e-12, f"{name}: closed form {pipe['bubble_closed_form']}")

        times = e.get("time", [])
        check(len(times) == len(e["memory"]), f"{name}: {len(times)} times for {len(e['memory'])} classes")
        steps = {round(t["step_seconds"], 15) for t in times}
        check(len(steps) == 1, f"{name}: the classes' steps differ: {steps}")
        for t in times:
            check(t["pipeline_seconds"] >= t["compute_seconds"] and (t["bubble"] > 0 or pp == 1)
                  and t["step_seconds"] >= t["pipeline_seconds"],
                  f"{name} ranks {t['ranks']}: pipeline {t['pipeline_seconds']} s, compute {t['compute_seconds']} s, "
                  f"step {t['step_seconds']} s, bubble {t['bubble']}")

    # the last stage's kept outputs under mixed precision: 6 more microbatches hold 6 more bf16
    # outputs ([1, 64, 4096] each) on the last pp rank, as the same plan in a bf16 model does
    model = open(f"{ROOT}/models/llama_rope.yaml").read().replace("vocab: 64", "vocab: 4096")
    model = model.replace("out: 64,", "out: 4096,").replace("tokens: [4, 8]", "tokens: [{rows}, 64]")
    grown = {}
    for mp in (True, False):
        for m in (2, 8):
            mpath = os.path.join(tmp, f"kept_{m}.yaml")
            with open(mpath, "w") as f:
                f.write(re.sub(r"gradient_accumulation: \d+", "gradient_accumulation: 1", model.replace("{rows}", str(2 * m))))
            ppath = os.path.join(tmp, f"kept_plan_{m}_{mp}.yaml")
            with open(ppath, "w") as f:
                f.write("mesh: {pp: 2, dp: 2}\ndata_parallel:\n  mesh_dim: dp\n  mode: fully_shard\n"
                        "  fully_shard: [layers.*]\n"
                        + ("  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}\n" if mp else "")
                        + f"pipeline_parallel: {{mesh_dim: pp, schedule: 1f1b, microbatches: {m}, "
                          "split_points: [layers.1]}\n")
            out = os.path.join(tmp, f"kept_{m}_{mp}.json")
            extra = [] if mp else ["--dtype", "bfloat16"]
            p = subprocess.run([PTOOL, "explain", mpath, ppath, "--json", out, *extra], capture_output=True,
                               text=True, timeout=300)
            if not check(p.returncode == 0, f"kept outputs m={m} mp={mp}: exit {p.returncode}\n{p.stderr[-800:]}"):
                continue
            last = [c for c in json.load(open(out))["memory"] if 3 in c["ranks"]]
            if check(len(last) == 1, f"kept outputs m={m}: no class holds rank 3"):
                grown[(mp, m)] = last[0]["allocated_peak_bytes"]
    if len(grown) == 4:
        want = 6 * 64 * 4096 * 2  # six more bf16 outputs
        for mp in (True, False):
            got = grown[(mp, 8)] - grown[(mp, 2)]
            check(got >= want, f"last stage, mixed precision {mp}: 2 -> 8 microbatches grows {got} B, "
                               f"under the {want} B of six more kept outputs")

check.finish()
