"""Compact goldens (verify/golden_compact.h): much smaller than full ones, replay PASS, and a moved
norm, a moved sampled element or a moved loss FAIL naming the tensor; a stripped file is exit 2;
--compact with --init is exit 2; a parallel fault still fails (parallel vs reference is whole).

    python3 tests/golden_compact.py PTOOL ROOT"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
check = Checks()
M, P = f"{ROOT}/models/llama_rope.yaml", f"{ROOT}/plans/llama_rope_tp_sp.yaml"


def run(*args, env=None):
    p = subprocess.run([PTOOL, *args], capture_output=True, text=True, timeout=300, env=dict(os.environ, **(env or {})))
    return p.returncode, p.stdout + p.stderr


def edit(src, dst, name, index, delta=None, drop=False):
    """Copies a golden with `delta` added to one float64 element of `name` (or the tensor dropped)."""
    data = open(src, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    old = data[8 + n:]
    body, out = bytearray(), {}
    for k, h in sorted(((k, h) for k, h in header.items() if k != "__metadata__"), key=lambda kv: kv[1]["data_offsets"][0]):
        if drop and k == name:
            continue
        b, e = h["data_offsets"]
        blob = bytearray(old[b:e])
        if k == name and not drop:
            v = struct.unpack("<d", blob[8 * index:8 * index + 8])[0]
            blob[8 * index:8 * index + 8] = struct.pack("<d", v + delta)
        out[k] = dict(h, data_offsets=[len(body), len(body) + len(blob)])
        body += blob
    out["__metadata__"] = header["__metadata__"]
    header = out
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(h)) + h + bytes(body))


with tempfile.TemporaryDirectory() as tmp:
    full, compact = os.path.join(tmp, "full.safetensors"), os.path.join(tmp, "compact.safetensors")
    rc, out = run("golden", "record", M, P, "-o", full)
    check(rc == 0, f"record full: {out}")
    rc, out = run("golden", "record", M, P, "-o", compact, "--compact", "--sample", "16")
    check(rc == 0, f"record compact: {out}")
    fs, cs = os.path.getsize(full), os.path.getsize(compact)
    check(cs * 2 < fs, f"compact {cs} B is not under half of full {fs} B")
    rc, out = run("verify", compact, "-q")
    check(rc == 0 and "PASS" in out, f"compact replay: {rc}\n{out}")
    rc, out = run("golden", "show", compact)
    check(rc == 0 and "step0.grad.layers.0.attn_block.attention.q_proj.weight.norm" in out, f"golden show compact: {rc}\n{out[-500:]}")
    key = "step1.grad.layers.0.attn_block.attention.q_proj.weight"
    # beyond what the elementwise rule allows (atol 1e-5, and for the norm atol * sqrt(1024) = 3.2e-4)
    for what, name, index, scale in [("a norm moved by 1e-3", key + ".norm", 0, 1e-3),
                                     ("a sampled element moved by 1e-4", key + ".sample", 5, 1e-4),
                                     ("the loss moved by 0.1%", "step1.loss", 0, 1.001)]:
        bad = os.path.join(tmp, "bad.safetensors")
        if name == "step1.loss":  # the loss is whole, in the model's dtype (float32)
            data = open(compact, "rb").read()
            n = struct.unpack("<Q", data[:8])[0]
            header = json.loads(data[8:8 + n])
            body = bytearray(data[8 + n:])
            b = header[name]["data_offsets"][0]
            body[b:b + 4] = struct.pack("<f", struct.unpack("<f", body[b:b + 4])[0] * scale)
            open(bad, "wb").write(data[:8 + n] + bytes(body))
        else:
            edit(compact, bad, name, index, scale)
        rc, out = run("verify", bad, "-q")
        tensor = name.rsplit(".", 1)[0] if name != "step1.loss" else name
        check(rc == 1 and "FAIL" in out and tensor in out, f"{what}: exit {rc}, want 1 naming {tensor}\n{out[-800:]}")
    stripped = os.path.join(tmp, "stripped.safetensors")
    edit(compact, stripped, key + ".sample", 0, drop=True)
    rc, out = run("verify", stripped, "-q")
    check(rc == 2 and key + ".sample" in out, f"stripped compact golden: exit {rc}\n{out}")
    rc, out = run("golden", "record", M, P, "-o", os.path.join(tmp, "x.safetensors"), "--compact", "--init", full)
    check(rc == 2 and "--compact records no init" in out, f"--compact --init: exit {rc}\n{out}")
    rc, out = run("verify", compact, "-q", env={"PTOOL_FAULT": "skip_all_reduce:layers.0.ffn_block.feed_forward.down_proj"})
    check(rc == 1, f"a parallel fault against a compact golden: exit {rc}\n{out[-600:]}")
check.finish()
