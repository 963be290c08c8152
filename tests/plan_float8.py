#!/usr/bin/env python3
"""Float8 in explain's pricing and `ptool plan --float8` (issue 48 item 4), end to end.

    plan_float8.py PTOOL ROOT

1. A cluster's `tflops: {float8: ...}` is its float8 capability: explain of a float8 plan on a
   cluster without it (the A100's, this machine's) is exit 2 at the plan's float8 section, naming
   the cluster and why; `ptool plan --float8` there is exit 2 naming the cluster, nothing written.
2. `--float8 never` (the default) prints what it printed without the option, with no float8 in its
   plans or --json.
3. `--float8 tensorwise` writes every candidate with the section (torchtitan's defaults, `compile:
   true`, the float8 all-gather under fully_shard over dp ranks); the plan -o writes loads, and
   explain of it gives the search's peak and step (the model is not extrapolated: to 1e-9); in
   float32 every such plan verifies PASS.
4. `--float8 offer` lists each candidate both ways; `--float8 rowwise` writes rowwise on every mesh
   (tensor parallelism too), without the float8 all-gather, and its tp plans verify in float32.
5. Llama-3-8B on 8 H100s, `--float8 offer`: every float8 candidate listed (extrapolated from 4 and 5
   blocks) is explain's within 1%, as plan_cases.py holds the plain ones; float8 pays there.
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
H100, A100, CPU = (f"{ROOT}/clusters/{c}.yaml" for c in ("h100_8x8", "a100_8x8", "cpu_local"))
ROPE = f"{ROOT}/models/llama_rope.yaml"
M8 = f"{ROOT}/models/scale/llama3_8b.yaml"


def run(*args, timeout=600):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def explained(model, plan, tmp):
    """explain --cluster H100 --json of a plan: (the worst rank's allocated peak, the step, the text)."""
    ej = os.path.join(tmp, "explain.json")
    rc, out = run("explain", model, plan, "--cluster", H100, "--json", ej)
    if not check(rc == 0, f"explain {plan}: exit {rc}\n{out[-2000:]}"):
        return None
    e = json.load(open(ej))
    return max(m["allocated_peak_bytes"] for m in e["memory"]), max(t["step_seconds"] for t in e["time"]), out


with tempfile.TemporaryDirectory() as tmp:
    # 1. the capability
    shipped = f"{ROOT}/tests/data/float8/llama_rope_fsdp_tp_float8.yaml"
    line = open(shipped).read().splitlines().index("float8: {recipe: tensorwise}") + 1
    for cluster, name in ((A100, "a100_8x8"), (CPU, "cpu_local")):
        rc, out = run("explain", ROPE, shipped, "--cluster", cluster)
        check(rc == 2 and re.search(rf"llama_rope_fsdp_tp_float8\.yaml:{line}:9: float8: the cluster '{name}' \(.*\) has no "
                                    r"float8 tensor cores: its 'tflops' has no float8 entry", out),
              f"explain of a float8 plan on {name}: exit {rc}\n{out[-1500:]}")
    rc, out = run("explain", ROPE, shipped, "--cluster", H100)
    check(rc == 0 and "float8 tensorwise on 14 linears" in out,
          f"explain of a float8 plan on the H100s: exit {rc}\n{out[-1500:]}")
    target = os.path.join(tmp, "refused.yaml")
    for opt in ("tensorwise", "rowwise", "offer"):
        rc, out = run("plan", ROPE, "--cluster", A100, "--world-size", "4", "--float8", opt, "-o", target)
        check(rc == 2 and f"--float8 {opt}: the cluster 'a100_8x8'" in out and "no float8 tensor cores" in out
              and not os.path.exists(target), f"plan --float8 {opt} on the A100s: exit {rc}\n{out[-1500:]}")
    rc, out = run("plan", ROPE, "--cluster", H100, "--float8", "sometimes")
    check(rc == 2 and "--float8" in out, f"--float8 sometimes: exit {rc}\n{out[-800:]}")

    # 2. never: today's output
    j = os.path.join(tmp, "p.json")
    outputs = []
    for flags in ([], ["--float8", "never"]):
        rc, out = run("plan", ROPE, "--cluster", H100, "--world-size", "4", "--json", j, *flags)
        check(rc == 0, f"plan {flags}: exit {rc}\n{out}")
        outputs.append(re.sub(r"simulated in [\d.]+ s", "", out))
        doc = json.load(open(j))
        check("float8" not in doc and all("float8" not in c and "float8" not in c["plan"] for c in doc["candidates"]),
              f"plan {flags}: float8 in the --json")
    check(outputs[0] == outputs[1] and "float8" not in outputs[0], f"--float8 never changes the output:\n{outputs[0]}\n{outputs[1]}")

    # 3. tensorwise: written, loaded, explained as searched
    written = os.path.join(tmp, "rope_float8.yaml")
    rc, out = run("plan", ROPE, "--cluster", H100, "--world-size", "4", "--float8", "tensorwise", "--json", j, "-o", written)
    if check(rc == 0 and os.path.exists(written), f"plan --float8 tensorwise: exit {rc}\n{out}"):
        check(validate_file(j, "plan") is None, f"--float8 tensorwise --json: {validate_file(j, 'plan')}")
        doc = json.load(open(j))
        cands = doc["candidates"]
        check(doc.get("float8") == "tensorwise" and len(cands) >= 4 and all(c.get("float8", {}).get("recipe") == "tensorwise" for c in cands),
              f"--float8 tensorwise: the candidates' float8 {[c.get('float8') for c in cands]}")
        header = out.splitlines()[[k for k, l in enumerate(out.splitlines()) if l.strip().startswith("#  mesh")][0]]
        check("float8" in header.split(), f"no float8 column: {header}")
        text = open(written).read()
        check("float8:\n  recipe: tensorwise\n" in text and "compile: true\n" in text and "# float8 tensorwise" in text,
              f"the written plan:\n{text}")
        for k, c in enumerate(cands):
            plan = os.path.join(tmp, f"rope_tw_{k}.yaml")
            open(plan, "w").write(c["plan"])
            gathered = "enable_fsdp_float8_all_gather: true" in c["plan"]
            check(gathered == (c["mode"] == "fully_shard" and c["dp"] > 1) == c["float8"]["enable_fsdp_float8_all_gather"],
                  f"tensorwise #{k}: the all-gather {gathered} under {c['mode']} over dp {c['dp']}")
            e = explained(ROPE, plan, tmp)
            if e is None:
                continue
            peak, step, text = e
            check(abs(c["peak_bytes"] - peak) <= 1e-9 * peak and abs(c["step_seconds"] - step) <= 1e-9 * step
                  and "float8 tensorwise on 14 linears" in text and "torch.compile: their casts priced fused" in text,
                  f"tensorwise #{k} ({c['dp']}x{c['tp']} {c['mode']}): searched peak {c['peak_bytes']} step {c['step_seconds']}, "
                  f"explain's {peak} {step}\n{text[-1500:]}")
        e = explained(ROPE, written, tmp)  # -o's file, with its header
        check(e is not None and abs(e[1] - cands[0]["step_seconds"]) <= 1e-9 * e[1], f"-o's plan explains to {e and e[1]}")
    # in float32 (verify's float8 bounds), every planned float8 plan verifies
    rc, out = run("plan", ROPE, "--cluster", H100, "--world-size", "4", "--float8", "tensorwise", "--mixed-precision", "none", "--json", j)
    verified = 0
    for k, c in enumerate(json.load(open(j))["candidates"] if rc == 0 else []):
        plan = os.path.join(tmp, f"rope_f32_{k}.yaml")
        open(plan, "w").write(c["plan"])
        rc, out = run("verify", ROPE, plan, "-q")
        verified += check(rc == 0 and "PASS" in out, f"float32 float8 #{k}: verify exit {rc}\n{c['plan']}\n{out[-2000:]}")
    check(verified >= 4, f"{verified} planned float8 plans verified")
    print(f"verified {verified} float8 plans ptool plan wrote for llama_rope on 4 ranks (float32)")

    # 4. offer and rowwise
    rc, out = run("plan", ROPE, "--cluster", H100, "--world-size", "4", "--float8", "offer", "--top", "100", "--json", j)
    if check(rc == 0, f"--float8 offer: exit {rc}\n{out}"):
        cands = json.load(open(j))["candidates"]
        shape = lambda c: (c["dp"], c["tp"], c["cp"], c["mode"], c["activation_checkpointing_mode"])  # noqa: E731
        plain = sorted(shape(c) for c in cands if "float8" not in c)
        f8 = sorted(shape(c) for c in cands if "float8" in c)
        check(plain and plain == f8, f"--float8 offer: without {plain}, with {f8}")
        check([c["step_seconds"] for c in cands] == sorted(c["step_seconds"] for c in cands), "offer: not ranked by step")
        check(re.search(r"float8 tensorwise \(compiled\): the fastest plan with it [\d.]+ \w+ a step, without it [\d.]+ \w+ \(speed-up x", out),
              f"offer: no float8 line\n{out}")
    rc, out = run("plan", ROPE, "--cluster", H100, "--world-size", "4", "--float8", "rowwise", "--mixed-precision", "none", "--json", j)
    if check(rc == 0, f"--float8 rowwise: exit {rc}\n{out}"):
        check(validate_file(j, "plan") is None, f"--float8 rowwise --json: {validate_file(j, 'plan')}")
        cands = json.load(open(j))["candidates"]
        check(cands and all(c["float8"] == {"recipe": "rowwise", "enable_fsdp_float8_all_gather": False, "compile": True} for c in cands),
              f"--float8 rowwise: the candidates' float8 {[c.get('float8') for c in cands]}")
        # rowwise under tensor parallelism (each row's amax reduced over tp where tp cuts its dim): verifies
        tp = [c for c in cands if c["tp"] > 1]
        for k, c in enumerate(tp[:2]):
            plan = os.path.join(tmp, f"rope_rw_{k}.yaml")
            open(plan, "w").write(c["plan"])
            rc, out = run("verify", ROPE, plan, "-q")
            check(rc == 0 and "PASS" in out, f"rowwise tp{c['tp']} #{k}: verify exit {rc}\n{c['plan']}\n{out[-2000:]}")
        check(len(tp) >= 1, "--float8 rowwise: no tp > 1 candidate")

    # 5. Llama-3-8B on 8 H100s (extrapolated): float8 candidates as explain prices them
    rc, out = run("plan", M8, "--cluster", H100, "--world-size", "8", "--float8", "offer", "--top", "100", "--json", j)
    if check(rc == 0, f"plan llama3_8b --float8 offer: exit {rc}\n{out}"):
        cands = json.load(open(j))["candidates"]
        f8 = [c for c in cands if "float8" in c]
        check(len(f8) >= 4, f"llama3_8b: {len(f8)} float8 candidates fit")
        compared = 0
        for k, c in enumerate(f8[:6]):
            plan = os.path.join(tmp, f"m8_f8_{k}.yaml")
            open(plan, "w").write(c["plan"])
            e = explained(M8, plan, tmp)
            if e is None:
                continue
            peak, step, _ = e
            what = f"llama3_8b float8 #{k} ({c['dp']}x{c['tp']} cp{c['cp']} {c['mode']} {c['activation_checkpointing_mode']} micro {c['microbatches']})"
            check(abs(c["peak_bytes"] - peak) <= 0.01 * peak, f"{what}: planned peak {c['peak_bytes']:.0f} B, explain's {peak} B")
            check(abs(c["step_seconds"] - step) <= 0.01 * step, f"{what}: planned step {c['step_seconds']} s, explain's {step} s")
            compared += 1
        check(compared >= 4, f"only {compared} float8 candidates compared with explain")
        best = {bool("float8" in c): c for c in reversed(cands)}
        if check(True in best and False in best, "llama3_8b: both variants fit"):
            gain = best[False]["step_seconds"] / best[True]["step_seconds"]
            print(f"llama3_8b on 8 H100s: fastest float8 {best[True]['step_seconds']:.3f} s, without {best[False]['step_seconds']:.3f} s "
                  f"(x{gain:.2f}); {compared} float8 candidates within 1% of explain")
            check(gain > 1, f"float8 does not pay for Llama-3-8B on 8 H100s: x{gain:.3f}")

check.finish()
