#!/usr/bin/env python3
"""`ptool verify` gives the same exit code in one process and under mpirun, for the same inputs.

    exit_codes.py PTOOL ROOT

Every case runs twice: in-process (rank threads) and under `mpirun -np N` (N = the plan's world
size), and both must exit with the expected code: 0 agree, 1 mismatch, 2 bad input, 3 failure.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

PTOOL, ROOT = sys.argv[1], sys.argv[2]
M, P, G = f"{ROOT}/models", f"{ROOT}/plans", f"{ROOT}/golden"
passed, failed = 0, 0


def run(args, env, mpi):
    cmd = [PTOOL, "verify", *args, "-q"]
    if mpi:
        cmd = ["timeout", "120", "mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(mpi)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **env), timeout=180)
    return p.returncode, p.stdout + p.stderr


def case(what, want, args, ranks, env=None, fragment=""):
    global passed, failed
    for mpi in (0, ranks):
        rc, out = run(args, env or {}, mpi)
        ok = rc == want and fragment in out
        passed += ok
        failed += not ok
        if not ok:
            print(f"FAIL: {what} ({'mpirun -np %d' % mpi if mpi else 'in-process'}): exit {rc}, want {want}"
                  f"{' with ' + repr(fragment) if fragment else ''}\n{out}")


with tempfile.TemporaryDirectory() as tmp:
    bad_plan = os.path.join(tmp, "bad_plan.yaml")
    open(bad_plan, "w").write("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    net1: colwize\n")
    conflict = os.path.join(tmp, "conflict.yaml")
    open(conflict, "w").write("mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n    layers.0.net1: colwise\n")
    junk = os.path.join(tmp, "junk.safetensors")
    open(junk, "wb").write(os.urandom(40))
    replay = os.path.join(tmp, "replay")
    os.mkdir(replay)
    shutil.copy(f"{G}/mlp_root_module.safetensors", replay)
    mlp, root = f"{M}/mlp.yaml", f"{P}/mlp_root_module.yaml"

    case("a correct plan", 0, [mlp, root], 4)
    case("a correct 2-D plan", 0, [f"{M}/mlp_stacked_mse.yaml", f"{P}/mlp_stacked_dp2_tp2.yaml"], 4)
    case("an injected bug", 1, [mlp, root], 4, {"PTOOL_FAULT": "wrong_shard_offset:net1"}, "first divergence")
    case("a missing model", 2, [f"{tmp}/none.yaml", root], 4, fragment="none.yaml")
    case("a plan with an unknown style", 2, [mlp, bad_plan], 2, fragment="bad_plan.yaml:5:11:")
    case("a layout conflict", 2, [f"{M}/mlp_stacked.yaml", conflict], 2, fragment="needs whole rows")
    case("--golden naming no file", 2, [mlp, root, "--golden", f"{tmp}/none.safetensors"], 4, fragment="none.safetensors")
    case("--golden with a damaged file", 2, [mlp, root, "--golden", junk], 4, fragment="junk.safetensors")
    case("--golden three ways", 0, [mlp, root, "--golden", f"{G}/mlp_root_module.safetensors"], 4, fragment="PASS")
    case("--init with a damaged file", 2, [mlp, root, "--init", junk], 4, fragment="junk.safetensors")
    case("--mesh malformed", 2, [mlp, root, "--mesh", "tp=x"], 4, fragment="--mesh 'tp=x'")
    case("--mesh naming no dim", 2, [mlp, root, "--mesh", "dp=2"], 4, fragment="no mesh dim 'dp'")
    case("--mesh leaving src_data_rank outside", 2, [mlp, f"{P}/mlp_src_data_rank_1.yaml", "--mesh", "tp=1"], 1,
         fragment="src_data_rank 1 is outside the 1 ranks")
    case("a bad PTOOL_FAULT", 2, [mlp, root], 4, {"PTOOL_FAULT": "no_such:x"}, "PTOOL_FAULT")
    case("--steps 0", 2, [mlp, root, "--steps", "0"], 4)
    case("golden replay", 0, [replay], 2, fragment="1 passed")
    case("--update without golden files", 2, [mlp, root, "--update"], 4, fragment="--update")
    # the collective timeout bounds a collective, not rank 0's reference: the timeout half of the
    # whole run measured just before in the same mode (3.8 s here), so the reference outlasts it while
    # no step's wait comes near it, however loaded the machine (a fixed 1 s met a slow collective on
    # a busy 2-core CI machine)
    timed = [f"{M}/gemm_mlp.yaml", f"{P}/gemm_mlp_tp.yaml", "--mesh", "tp=2", "--steps", "10"]
    for mpi in (0, 2):
        t0 = time.monotonic()
        rc, out = run(timed, {}, mpi)
        whole = time.monotonic() - t0
        limit = max(2, int(whole / 2))
        rc2, out2 = run(timed + ["--timeout", str(limit)], {}, mpi) if rc == 0 else (rc, out)
        ok = rc == 0 and rc2 == 0 and "PASS" in out2
        passed += ok
        failed += not ok
        if not ok:
            print(f"FAIL: a reference longer than --timeout {limit} ({'mpirun -np 2' if mpi else 'in-process'}, "
                  f"the run {whole:.1f} s): exit {rc}, then {rc2}, want 0 with PASS\n{out}\n{out2}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
