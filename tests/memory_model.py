#!/usr/bin/env python3
"""Predicted vs measured memory per rank, for every shipped plan.

    memory_model.py PTOOL ROOT [--table]

`ptool explain --json` predicts each distinct rank's peak by executing the plan's steps on meta
tensors (train/simulate.h); `ptool verify --json` measures every rank's peak from the tensors its
thread allocated (core/memory_account.h). explain simulates one rank per class of ranks whose
shards have the same sizes and names the ranks each stands for; fails unless every rank's
measurement equals its class's prediction to the byte (the same quantity by construction:
docs/architecture.md). explain simulates at least three steps: its headline peak
(predicted_peak_bytes) is the steady state, the optimizer's state held throughout, and
first_step_peak_bytes the first step's; a verify of one step is held to the latter, of more to the
former. --table prints docs/tour.md's table.

A mixture of experts' plans are the exception: explain routes on meta tensors, which have no values,
so it assumes balanced routing (each expert tokens x top_k / experts rows, model/moe_routing.h) while
verify routes its batch. The experts' rows sum to tokens x top_k either way, so what differs is the
transient of the largest expert's rows and the allocator's rounding: held within 1% here, and the
docs/tour.md's table shows the error. Under expert parallelism a rank computes the rows every rank sends
its experts, which real routing makes more or fewer than its own tokens x top_k: held within 2%.
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
TABLE = "--table" in sys.argv
check = Checks()


def format_bytes(b):  # as ptool prints bytes (cli/verify_output.cpp)
    if b < 1024:
        return f"{b} B"
    if b < 1 << 20:
        return f"{b / 1024:.1f} KiB"
    if b < 1 << 30:
        return f"{b / 1048576:.1f} MiB"
    return f"{b / 1073741824:.2f} GiB"


def predicted_peaks(explain_json):
    """{rank: explain's predicted peak} for what verify runs: the first step's peak when verify runs
    one step (explain_json's verify_steps), else the steady state's (the headline)."""
    e = json.load(open(explain_json))
    key = "first_step_peak_bytes" if e["verify_steps"] == 1 else "predicted_peak_bytes"
    return {r: m[key] for m in e["memory"] for r in m["ranks"]}


def measured_peaks(verify_json):
    return {m["rank"]: m["measured_peak_bytes"] for m in json.load(open(verify_json))["plans"][0]["memory"]}


def cases():
    for plan in sorted(glob.glob(f"{ROOT}/plans/*.yaml")):
        name = os.path.basename(plan)[:-5]
        if name.startswith("gemm_mlp"):
            continue  # benchmark-sized: bench/ runs them
        model = re.search(r"models/[a-z_0-9]*\.yaml", open(plan).read()).group(0)
        yield f"{ROOT}/{model}", plan


rows = []
with tempfile.TemporaryDirectory() as tmp:
    for model, plan in cases():
        name = os.path.basename(plan)[:-5]
        ej, vj = os.path.join(tmp, "e.json"), os.path.join(tmp, "v.json")
        p = subprocess.run([PTOOL, "explain", model, plan, "--json", ej], capture_output=True, text=True, timeout=120)
        q = subprocess.run([PTOOL, "verify", model, plan, "--json", vj, "-q"], capture_output=True, text=True, timeout=300)
        if p.returncode != 0 or not os.path.exists(vj):
            check(False, f"{name}: explain exit {p.returncode}, verify exit {q.returncode}\n{p.stderr}{q.stdout}{q.stderr}")
            continue
        for doc, kind in ((ej, "explain"), (vj, "verify")):  # every shipped plan's documents match docs/schema/
            err = validate_file(doc, kind)
            check(err is None, f"{name}: {err}")
        predicted, measured = predicted_peaks(ej), measured_peaks(vj)
        check(sorted(predicted) == sorted(measured), f"{name}: explain's rank classes cover {sorted(predicted)}, verify ran {sorted(measured)}")
        worst = 0.0
        routed = re.search(r"type: moe\b", open(model).read()) is not None  # balanced routing predicted
        dispatched = re.search(r"^expert_parallel:", open(plan).read(), re.M) is not None  # other ranks' rows
        for rank, meas in measured.items():
            pred = predicted.get(rank, 0)
            err = abs(pred - meas) / meas if meas else float(pred != 0)
            worst = max(worst, err)
            check(err <= (0.02 if dispatched else 0.01) if routed else pred == meas,
                  f"{name} rank {rank}: predicted {pred} B, measured {meas} B ({pred - meas:+} B, {100 * err:.3f}%)")
        rows.append((name, len(measured), max(predicted.values()), max(measured.values()), worst))

# ranks whose pieces differ only where explain's rank classes once merged them (found 2026-11-30): a
# dim tp does not cut, sharded over HSDP's dp_shard (two ranks were predicted 80 B low); a cp rank's
# positions cut over tp by sequence parallelism (tp rank 3, holding none, predicted 4.5% high); rows
# fully_shard chunks unevenly over dp x cp flattened (97 over 2 x 2: rank 3 holds 22, ranks 0 to 2 25)
with tempfile.TemporaryDirectory() as tmp:
    fsdp_cp = os.path.join(tmp, "fsdp_cp.yaml")
    open(fsdp_cp, "w").write("mesh: {dp: 2, cp: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard, "
                             "fully_shard: [\"model.layers.*\"]}\ncontext_parallel: {mesh_dim: cp}\n")
    for model, plan, extra in (("mlp_hsdp_uneven", "mlp_stacked_hsdp_tp", ["--mesh", "dp_replicate=3", "--mesh", "dp_shard=3"]),
                               ("llama_cp_tp_uneven", "llama_rope_cp_tp", ["--mesh", "tp=4"]),
                               ("qwen_vocab97", fsdp_cp, [])):
        ej, vj = os.path.join(tmp, "e.json"), os.path.join(tmp, "v.json")
        args = [f"{ROOT}/tests/data/models/{model}.yaml",
                plan if os.path.isabs(plan) else f"{ROOT}/plans/{plan}.yaml", *extra]
        p = subprocess.run([PTOOL, "explain", *args, "--json", ej], capture_output=True, text=True, timeout=120)
        q = subprocess.run([PTOOL, "verify", *args, "--json", vj, "-q"], capture_output=True, text=True, timeout=300)
        if not check(p.returncode == 0 and q.returncode == 0 and os.path.exists(vj),
                     f"{model} x {plan}: explain exit {p.returncode}, verify exit {q.returncode}\n{p.stderr}{q.stderr}"):
            continue
        predicted, measured = predicted_peaks(ej), measured_peaks(vj)
        for rank, meas in measured.items():
            check(predicted.get(rank) == meas, f"{model} x {plan} rank {rank}: predicted {predicted.get(rank)} B, measured {meas} B")

# attn_implementation: flash keeps no [B*H, T, T] probabilities: the same numbers bitwise, a lower
# peak, still predicted exactly (llama_rope at 64 tokens, where the T^2 term shows)
with tempfile.TemporaryDirectory() as tmp:
    base = open(f"{ROOT}/models/llama_rope.yaml").read().replace("tokens: [4, 8]", "tokens: [4, 64]")
    peaks, goldens = {}, {}
    for impl in ("eager", "flash"):
        model = os.path.join(tmp, f"{impl}.yaml")
        open(model, "w").write(base.replace("rope_theta: 10000,", f"rope_theta: 10000, attn_implementation: {impl},"))
        plan = f"{ROOT}/plans/llama_rope_tp_sp.yaml"
        ej, vj, g = os.path.join(tmp, "e.json"), os.path.join(tmp, "v.json"), os.path.join(tmp, f"{impl}.safetensors")
        subprocess.run([PTOOL, "explain", model, plan, "--json", ej], capture_output=True, timeout=120)
        q = subprocess.run([PTOOL, "verify", model, plan, "--json", vj, "-q"], capture_output=True, text=True, timeout=300)
        check(q.returncode == 0, f"{impl}: verify exit {q.returncode}\n{q.stdout}{q.stderr}")
        predicted, measured = predicted_peaks(ej), measured_peaks(vj)
        check(predicted == measured, f"{impl}: predicted {predicted}, measured {measured}")
        peaks[impl] = max(measured.values())
        subprocess.run([PTOOL, "golden", "record", model, plan, "-o", g], capture_output=True, timeout=300)
    check(peaks["flash"] < peaks["eager"], f"flash's peak {peaks['flash']} B is not below eager's {peaks['eager']} B")
    d = subprocess.run([PTOOL, "golden", "diff", os.path.join(tmp, "eager.safetensors"), os.path.join(tmp, "flash.safetensors"),
                        "--rtol", "0", "--atol", "0"],  # bitwise
                       capture_output=True, text=True, timeout=120)
    check(" 0 of " in d.stdout and "tensors differ" in d.stdout, f"flash vs eager goldens differ:\n{d.stdout[-1500:]}")
    print(f"llama_rope at 64 tokens, tp 2: peak per rank eager {peaks['eager']:,} B, flash {peaks['flash']:,} B")

# The steady state is the headline. An imported model says steps: 1 (the model format's default) and
# trains with AdamW, whose two float32 states per parameter torch.optim creates at the first
# optimizer step: the first step's forward and backward run without them, every later step's with
# them. explain simulates three steps whatever the model says (the caching allocator's segments are
# steady from the third): its headline peak is the steady state,
# above the first step's by exactly the states' bytes here (a model whose peak is in the backward,
# the states held throughout it from the second step on), which a verify of two steps measures; the
# first step's peak is what a verify of one step measures.
with tempfile.TemporaryDirectory() as tmp:
    model, fsdp = os.path.join(tmp, "llama.yaml"), os.path.join(tmp, "fsdp.yaml")
    p = subprocess.run([PTOOL, "import", "hf", f"{ROOT}/tests/data/hf/tiny-llama31.json", "--batch", "4", "--seq", "64",
                        "-o", model], capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and "optimizer: {type: adamw}" in open(model).read() and "steps:" not in open(model).read(),
          f"import tiny-llama31: exit {p.returncode}\n{p.stdout}{p.stderr}")
    open(fsdp, "w").write("mesh: {dp: 2}\ndata_parallel: {mesh_dim: dp, mode: fully_shard, fully_shard: [\"model.layers.*\"]}\n")
    for plan, shards in ((f"{ROOT}/plans/empty_plan.yaml", 1), (fsdp, 2)):
        name = os.path.basename(plan)
        ej, v1, v2 = (os.path.join(tmp, f) for f in ("e.json", "v1.json", "v2.json"))
        p = subprocess.run([PTOOL, "explain", model, plan, "--json", ej], capture_output=True, text=True, timeout=120)
        q1 = subprocess.run([PTOOL, "verify", model, plan, "--json", v1, "-q"], capture_output=True, text=True, timeout=300)
        q2 = subprocess.run([PTOOL, "verify", model, plan, "--steps", "2", "--json", v2, "-q"], capture_output=True,
                            text=True, timeout=300)
        if not check(p.returncode == 0 and q1.returncode == 0 and q2.returncode == 0,
                     f"{name}: explain exit {p.returncode}, verify exits {q1.returncode} and {q2.returncode}\n{p.stderr}"):
            continue
        check(validate_file(ej, "explain") is None, f"{name}: {validate_file(ej, 'explain')}")
        e = json.load(open(ej))
        check(e["verify_steps"] == 1 and e["simulated_steps"] == 3,
              f"{name}: verify_steps {e['verify_steps']}, simulated_steps {e['simulated_steps']}")
        states = 2 * e["parameters"] * 4 // shards  # exp_avg and exp_avg_sq, float32, fully_shard's shard of them
        for m in e["memory"]:
            check(m["predicted_peak_bytes"] - m["first_step_peak_bytes"] == states and m["at_peak"].get("optimizer") == states,
                  f"{name} ranks {m['ranks']}: steady-state peak {m['predicted_peak_bytes']} B, first step's "
                  f"{m['first_step_peak_bytes']} B: not AdamW's {states} B of state apart ({m['at_peak']})")
        steady = {r: m["predicted_peak_bytes"] for m in e["memory"] for r in m["ranks"]}
        first = {r: m["first_step_peak_bytes"] for m in e["memory"] for r in m["ranks"]}
        check(first == measured_peaks(v1), f"{name}: first-step peaks {first}, a 1-step verify measured {measured_peaks(v1)}")
        check(steady == measured_peaks(v2), f"{name}: steady-state peaks {steady}, a 2-step verify measured {measured_peaks(v2)}")
        # the row: PyTorch's allocated and reserved peaks (the framework tally's steady state), its
        # first step's allocated, then ptool's own run's steady peak (what verify measured above)
        m0, peak = e["memory"][0], max(steady.values())
        cols = [m0["allocated_peak_bytes"], m0["predicted_reserved_peak_bytes"],
                m0["first_step_allocated_peak_bytes"], peak]
        check(m0["allocated_peak_bytes"] > m0["first_step_allocated_peak_bytes"],
              f"{name}: PyTorch's steady allocated peak {m0['allocated_peak_bytes']} B not above its first step's")
        check(re.search(r"^    0-\d+ +" + " +".join(re.escape(format_bytes(c)) for c in cols) + " ", p.stdout, re.M)
              is not None,
              f"{name}: explain's memory row is not {[format_bytes(c) for c in cols]}:\n{p.stdout[-1500:]}")
        print(f"tiny Llama 3.1 (steps: 1, AdamW) under {name}: first step {max(first.values()):,} B, "
              f"steady state {peak:,} B (+{states:,} B of AdamW state)")

# docs/tour.md's table and docs/planning.md's count are these measurements (--table prints the rows)
table = [f"| {name} | {n} | {pred:,} | {meas:,} | {100 * err:.2f}% |" for name, n, pred, meas, err in rows]
if TABLE:
    print("| plan | ranks | predicted peak (B) | measured peak (B) | worst rank error |\n|---|---|---|---|---|")
    print("\n".join(table))
readme = open(f"{ROOT}/docs/tour.md").read()
start = readme.index("| plan | ranks | predicted peak (B) |")
shown = [line for line in readme[start:].split("\n\n")[0].splitlines()[2:]]
check(shown == table, "docs/tour.md's memory table is not what this run measured (tests/memory_model.py PTOOL . --table prints it):\n"
      + "\n".join(f"  docs   {a!r}\n  run    {b!r}" for a, b in zip(shown + [""] * len(table), table + [""] * len(shown)) if a != b))
claim = re.search(r"all (\d+) plans, (\d+) ranks", open(f"{ROOT}/docs/planning.md").read())
check(claim and (int(claim.group(1)), int(claim.group(2))) == (len(rows), sum(r[1] for r in rows)),
      f"docs/planning.md says '{claim and claim.group(0)}'; measured {len(rows)} plans, {sum(r[1] for r in rows)} ranks")
check.finish()
