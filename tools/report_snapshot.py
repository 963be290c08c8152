#!/usr/bin/env python3
"""Snapshot of what ptool reports for every shipped case, to prove a refactor changed nothing.

    tools/report_snapshot.py PTOOL OUTDIR           record every case's reports into OUTDIR
    tools/report_snapshot.py --diff DIR_A DIR_B     compare two snapshots (exit 1 if any differs)

Each shipped plan runs with every model its header names (`models/NAME.yaml`): `verify --json` at
the plan's steps, at --steps 3, and at --mesh tp=4 where the plan has a tensor-parallel dim;
`explain --json` of the same pair; the golden folder's replay (`verify golden/ --json`); explain of
the scale plans on each cluster and `plan --json` of the scale models. Timing fields (seconds,
wall times) are dropped; every other field, number and string must be bitwise equal.
"""
import concurrent.futures
import glob
import json
import os
import re
import subprocess
import sys

TIMING = {"seconds", "reference_seconds", "search_seconds", "wall_seconds", "phases", "elapsed"}


def strip(o):
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if k not in TIMING and not k.endswith("_seconds_wall")}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o


def cases(root):
    out = []
    for plan in sorted(glob.glob(f"{root}/plans/*.yaml")):
        text = open(plan).read()
        models = []
        for m in re.findall(r"models/([a-z_0-9]+)\.yaml", text):
            if m not in models:
                models.append(m)
        name = os.path.basename(plan)[:-5]
        for m in models:
            out.append((f"{m}__{name}", f"{root}/models/{m}.yaml", plan, "tensor_parallel" in text))
    return out


def run(ptool, args, out_json, cwd):
    p = subprocess.run([ptool, *args, "--json", out_json], capture_output=True, text=True, cwd=cwd, timeout=600)
    return p.returncode


def record(ptool, outdir, root):
    os.makedirs(outdir, exist_ok=True)
    jobs = []
    for key, model, plan, tp in cases(root):
        rel_m, rel_p = os.path.relpath(model, root), os.path.relpath(plan, root)
        jobs.append((f"verify__{key}", ["verify", rel_m, rel_p, "-q"]))
        jobs.append((f"verify3__{key}", ["verify", rel_m, rel_p, "-q", "--steps", "3"]))
        if tp:
            jobs.append((f"verify_tp4__{key}", ["verify", rel_m, rel_p, "-q", "--mesh", "tp=4"]))
        jobs.append((f"explain__{key}", ["explain", rel_m, rel_p]))
    jobs.append(("golden_replay", ["verify", "golden/", "-q"]))
    for cluster in sorted(glob.glob(f"{root}/clusters/*.yaml")):
        c = os.path.relpath(cluster, root)
        cname = os.path.basename(cluster)[:-5]
        jobs.append((f"explain_scale70b__{cname}", ["explain", "models/scale/llama3_70b.yaml",
                                                     "plans/scale/llama3_70b_torchtitan.yaml", "--cluster", c]))
    for m in ("llama3_8b", "llama3_70b"):
        jobs.append((f"plan__{m}", ["plan", f"models/scale/{m}.yaml", "--cluster", "clusters/h100_8x8.yaml"]))

    def one(job):
        name, args = job
        path = os.path.join(outdir, name + ".json")
        rc = run(ptool, args, path + ".raw", root)
        doc = {"exit": rc}
        if os.path.exists(path + ".raw"):
            doc["report"] = strip(json.load(open(path + ".raw")))
            os.remove(path + ".raw")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        return name, rc

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
        for name, rc in ex.map(one, jobs):
            print(f"{rc}  {name}", flush=True)
    print(f"{len(jobs)} reports in {outdir}")


def diff(a, b):
    names = sorted(set(os.listdir(a)) | set(os.listdir(b)))
    bad = 0
    for n in names:
        pa, pb = os.path.join(a, n), os.path.join(b, n)
        if not os.path.exists(pa) or not os.path.exists(pb):
            print(f"only in one: {n}")
            bad += 1
            continue
        if open(pa).read() != open(pb).read():
            print(f"differs: {n}")
            bad += 1
    print(f"{len(names)} reports, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        sys.exit(diff(sys.argv[2], sys.argv[3]))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    record(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), root)
