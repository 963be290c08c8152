#!/usr/bin/env python3
"""Hostile inputs, one check per class: no signal, no hang, no PASS on nonsense, nothing clobbered.

    hostile_inputs.py PTOOL ROOT

Every command runs under a timeout; a hang, a signal (exit > 3 or negative) or the wrong exit code
fails the class. docs/testing.md (Reliability) lists the classes.
"""
import json
import os
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks  # noqa: E402

PTOOL, ROOT = sys.argv[1], sys.argv[2]
M, P, G = f"{ROOT}/models", f"{ROOT}/plans", f"{ROOT}/golden"
check = Checks()


def run(*args, env=None, timeout=60, stdout=subprocess.PIPE):
    try:
        p = subprocess.run([PTOOL, *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
        return p.returncode, (p.stdout or "") + p.stderr
    except subprocess.TimeoutExpired:
        return "hang", ""


def expect(code, frags, *args, **kw):
    rc, out = run(*args, **kw)
    check(rc == code and all(f in out for f in frags), f"{' '.join(args)}: exit {rc} (want {code} with {frags})\n{out[-2000:]}")
    return out


def write(path, text):
    open(path, "w" if isinstance(text, str) else "wb").write(text)
    return path


def tensors_file(path, tensors, meta=None):
    """safetensors with float32/int64 tensors: {name: (dtype, shape, values)}"""
    header, blob = {}, b""
    for name, (dt, shape, values) in tensors.items():
        data = b"".join(struct.pack("<f" if dt == "F32" else "<q", v) for v in values)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if meta:
        header["__metadata__"] = meta
    h = json.dumps(header).encode()
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blob)
    return path


def read_st(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def rewrite_st(src, dst, drop=(), meta=None):
    header, blob = read_st(src)
    out, new_blob = {}, b""
    for name, e in header.items():
        if name == "__metadata__":
            out[name] = dict(e, **(meta or {}))
            continue
        if name in drop:
            continue
        b, end = e["data_offsets"]
        out[name] = dict(e, data_offsets=[len(new_blob), len(new_blob) + end - b])
        new_blob += blob[b:end]
    h = json.dumps(out).encode()
    open(dst, "wb").write(struct.pack("<Q", len(h)) + h + new_blob)


with tempfile.TemporaryDirectory() as tmp:
    T = lambda name: os.path.join(tmp, name)  # noqa: E731
    mlp, root = f"{M}/mlp.yaml", f"{P}/mlp_root_module.yaml"

    # 1. size arithmetic: every product checked, a real byte limit
    big_emb = write(T("big_emb.yaml"), "batch: {input: {tokens: [2, 4], vocab: 8}}\nmodules:\n"
                    "  - {name: e, type: embedding, vocab: 1099511627776, dim: 16777216}\n")
    expect(2, ["big_emb.yaml:3:", "sizes overflow"], "run", big_emb)
    expect(2, ["big_emb.yaml:3:", "sizes overflow"], "explain", big_emb, root)
    big_lin = write(T("big_lin.yaml"), "batch: {input: [4, 1048576]}\nmodules:\n"
                    "  - {name: l, type: linear, in: 1048576, out: 1048576}\n")
    expect(2, ["big_lin.yaml:3:", "over the limit of 8589934592", "PTOOL_MODEL_BYTE_LIMIT"], "run", big_lin)
    expect(2, ["over the limit of 1024"], "run", mlp, env={"PTOOL_MODEL_BYTE_LIMIT": "1K"})
    expect(0, ["loss"], "run", mlp, env={"PTOOL_MODEL_BYTE_LIMIT": "1M"})
    expect(2, ["PTOOL_MODEL_BYTE_LIMIT"], "run", mlp, env={"PTOOL_MODEL_BYTE_LIMIT": "lots"})

    # 2. empty shards (torch.chunk's): 16 features over 5 ranks is 4, 4, 4, 4, 0
    expect(0, ["PASS 20/20"], "verify", mlp, root, "--mesh", "tp=5", "-q")
    expect(0, ["PASS"], "verify", f"{M}/seq_mlp.yaml", f"{P}/seq_mlp_sp.yaml", "--mesh", "tp=5", "-q")
    expect(0, ["PASS"], "verify", f"{M}/embedding_head.yaml", f"{P}/embedding_colwise.yaml", "--mesh", "tp=5", "-q")
    expect(0, ["PASS"], "verify", f"{M}/mlp_stacked_adamw.yaml", f"{P}/mlp_stacked_fully_shard.yaml", "--mesh", "dp=8", "-q")
    # batch rows 2 over tp 4 (Shard(0)): two ranks run attention (GQA) on an empty batch (found by
    # fuzz_model_plan); the plan is wrong (b1's gradients cover only each rank's rows), so a warning and FAIL
    attn = write(T("attn_rows.yaml"), "batch: {input: {tokens: [2, 2], vocab: 16}}\nmodules:\n"
                 "  - {name: wte, type: embedding, vocab: 16, dim: 8}\n"
                 "  - {name: b0, type: attention, dim: 8, heads: 4, kv_heads: 2}\n"
                 "  - {name: b1, type: attention, dim: 8, heads: 4, kv_heads: 2}\n"
                 "  - {name: head, type: linear, in: 8, out: 16}\n")
    rows_plan = write(T("attn_rows_plan.yaml"), "mesh: {tp: 4}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                      "    b0.o_proj: {style: rowwise, input_layouts: replicate, output_layouts: shard(0)}\n")
    expect(1, ["'b1.q_proj' (linear) gets Shard(0) activations", "FAIL"], "verify", attn, rows_plan)

    # 3. outputs never replace what is not a regular file; write errors are errors
    for dev in ("/dev/null", "/dev/full"):
        before = os.stat(dev)
        run("golden", "record", mlp, root, "-o", dev, "--force")
        run("verify", mlp, root, "--json", dev, "-q")
        after = os.stat(dev)
        check(stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev, f"{dev} is no longer the device")
    expect(3, ["/dev/full", "No space left"], "verify", mlp, root, "--json", "/dev/full", "-q")
    expect(3, ["standard output"], "run", mlp, stdout=open("/dev/full", "w"))
    target, link = T("target.json"), T("link.json")
    write(target, "old")
    os.symlink(target, link)
    expect(0, [], "verify", mlp, root, "--json", link, "-q")
    check(os.path.islink(link) and json.load(open(target))["pass"] is True, "a symlink output: the link replaced, or its target not written")
    fifo = T("out.fifo")
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", fifo], stdout=subprocess.PIPE)
    expect(0, [], "verify", mlp, root, "--json", fifo, "-q")
    got = reader.communicate(timeout=30)[0]
    check(stat.S_ISFIFO(os.stat(fifo).st_mode) and b'"pass"' in got, "a FIFO output: replaced, or nothing read through it")

    # 4. NaN: never passes on nonsense; propagated as PyTorch does; reported as nan
    nan_data = tensors_file(T("nan.safetensors"), {"input": ("F32", [12, 10], [float("nan")] * 120)})
    expect(2, ["nan.safetensors", "'input' element 0 is nan"], "verify", mlp, root, "--data", nan_data, "-q")
    nan_init = T("nan_init.safetensors")
    header, blob = read_st(f"{G}/mlp_root_module.safetensors")
    init = {k[len("init.param."):]: ("F32", e["shape"], [float("inf")] * (int(e["data_offsets"][1] - e["data_offsets"][0]) // 4))
            for k, e in header.items() if k.startswith("init.param.")}
    tensors_file(nan_init, init)
    expect(2, ["is inf"], "verify", mlp, root, "--init", nan_init, "-q")
    nan_golden = tensors_file(T("nan_golden.safetensors"), {"x": ("F32", [3], [1.0, float("nan"), 3.0])})
    expect(0, ["0 of 1 tensors differ"], "golden", "diff", nan_golden, nan_golden)
    other = tensors_file(T("other.safetensors"), {"x": ("F32", [3], [1.0, 2.0, 3.0])})
    out = expect(1, ["1 of 1 tensors differ"], "golden", "diff", nan_golden, other)
    check("nan" in out, f"a NaN against a number is reported as nan\n{out}")

    # 5. special files: no hang, no memory blow-up, clear messages
    fifo_in = T("in.fifo")
    os.mkfifo(fifo_in)
    expect(2, ["in.fifo", "empty"], "run", fifo_in, timeout=20)
    expect(2, ["/dev/zero", "reads more than"], "run", "/dev/zero", timeout=20)
    expect(2, ["is a directory"], "run", tmp)
    expect(2, ["is a directory"], "verify", mlp, root, "--init", tmp)

    # 6. resource limits: exit 3 naming the resource, never an abort
    if os.environ.get("PTOOL_SANITIZER") == "address":  # ASan maps terabytes of shadow memory: ulimit -v stops it first
        print("skipped under AddressSanitizer: 1000 ranks under ulimit -v (the plain build runs it)")
    else:
        rc, out = (lambda p: (p.returncode, p.stderr))(subprocess.run(
            ["bash", "-c", f"ulimit -v 3000000; exec {PTOOL} verify {mlp} {root} --mesh tp=1000 -q"],
            capture_output=True, text=True, timeout=120))
        check(rc == 3 and "cannot start rank" in out and "threads or memory" in out, f"1000 ranks under a memory limit: exit {rc}\n{out[-800:]}")

    # 7. unbounded steps
    steps_plan = write(T("steps.yaml"), "mesh: {tp: 2}\nverify: {steps: 1000000000}\n")
    expect(2, ["steps.yaml:2:17:", "over the limit of 100000"], "verify", mlp, steps_plan)
    expect(2, ["--steps"], "verify", mlp, root, "--steps", "1000000000")
    steps_model = write(T("steps_model.yaml"), open(mlp).read().replace("steps: 2", "steps: 1000000000"))
    expect(2, ["over the limit of 100000"], "run", steps_model)
    huge = T("huge_steps.safetensors")
    rewrite_st(f"{G}/mlp_root_module.safetensors", huge, meta={"steps": "1000000000"})
    expect(2, ["huge_steps.safetensors", "'steps'"], "verify", huge)

    # 8. a stripped golden does not pass: every tensor its model and plan imply must be there
    stripped = T("stripped.safetensors")
    header, _ = read_st(f"{G}/mlp_root_module.safetensors")
    keep = {"step0.loss", "step1.loss", "__metadata__"}
    rewrite_st(f"{G}/mlp_root_module.safetensors", stripped, drop=[k for k in header if k not in keep])
    expect(2, ["stripped.safetensors", "the golden has no 'init.param.net1.weight'"], "verify", stripped)
    one_grad = T("one_grad.safetensors")
    rewrite_st(f"{G}/mlp_root_module.safetensors", one_grad, drop=["step1.grad.net2.bias"])
    expect(2, ["no 'step1.grad.net2.bias'"], "verify", one_grad)

    # 10. nonsense
    neg = write(T("neg.yaml"), "mesh: {tp: 2}\nverify: {tolerance: {rtol: -1}}\n")
    expect(2, ["neg.yaml:2:", "rtol"], "verify", mlp, neg)
    expect(2, ["--rtol"], "verify", mlp, root, "--rtol", "-1")
    expect(2, ["--rtol"], "verify", mlp, root, "--rtol", "nan")
    expect(2, ["--atol"], "verify", mlp, root, "--atol", "inf")
    empty_compare = write(T("compare.yaml"), "mesh: {tp: 2}\nverify: {compare: []}\n")
    expect(2, ["compare.yaml:2:", "'compare' is empty"], "verify", mlp, empty_compare)
    no_tensors = tensors_file(T("empty.safetensors"), {})
    expect(2, ["holds no tensors"], "verify", mlp, root, "--data", no_tensors)
    late = tensors_file(T("late.safetensors"), {"step99999.input": ("F32", [12, 10], [0.5] * 120)})
    expect(2, ["'step99999.input' is for step 99999"], "verify", mlp, root, "--data", late)
    both = tensors_file(T("both.safetensors"), {"step01.input": ("F32", [12, 10], [0.5] * 120),
                                               "step1.input": ("F32", [12, 10], [0.5] * 120)})
    expect(2, ["step01.input"], "verify", mlp, root, "--data", both)

    # 11. YAML: tags, extra documents, merge keys, self-containing anchors
    for text, frag in (("mesh: !!python/object:os.system {tp: 2}\n", ":1:7: YAML tags are not supported"),
                       ("mesh: {tp: 2}\nx: !!binary aGVsbG8=\n", ":2:4: YAML tags are not supported"),
                       ("mesh: {tp: 2}\n---\nmesh: {tp: 4}\n", ":2:1: a second YAML document"),
                       ("base: &b {tp: 2}\nmesh:\n  <<: *b\n", ":3:3: merge keys"),
                       ("mesh: &x {tp: [*x]}\n", ": an alias refers to a node that contains it"),
                       # a ',' no rule consumes: yaml-cpp 0.7's LoadAll loops forever on these
                       (",\n", ":1:1: unexpected ','"),
                       ("- mesh\n, b}\n", ":2:1: unexpected ','"),
                       ("'mesh' ,\n", ":1:8: unexpected ','")):
        expect(2, [frag], "verify", mlp, write(T("y.yaml"), text))

    # 12. messages and codes
    utf = write(T("utf.yaml"), b"batch: {input: [4, 2]}\nmodules:\n  - {name: \"a\xff\", type: linear, in: 2, out: 2}\n")
    expect(2, ["utf.yaml:3:", "not valid UTF-8"], "run", utf)
    t0 = time.time()
    expect(2, ["is a directory"], "golden", "record", f"{M}/gemm_mlp.yaml", f"{P}/gemm_mlp_tp.yaml", "-o", tmp, "--force")
    check(time.time() - t0 < 5, "an unwritable output is found before the run")
    expect(2, ["is a directory"], "verify", mlp, root, "--json", tmp)
    shard7 = write(T("s7.yaml"), "mesh: {tp: 2}\ntensor_parallel:\n  mesh_dim: tp\n  plan:\n"
                   "    net1: {style: colwise, output_layouts: shard(7)}\n")
    expect(2, ["s7.yaml:5:5:", "shard(7)"], "verify", mlp, shard7)
    tokens = write(T("tokens.yaml"), "batch: {input: {tokens: [2, 4], vocab: 100}}\nmodules:\n"
                   "  - {name: e, type: embedding, vocab: 64, dim: 4}\n")
    expect(2, ["tokens.yaml:1:", "draws ids from [0, 100)", "64 rows"], "run", tokens)
    hup = T("hup.safetensors")
    p = subprocess.Popen([PTOOL, "golden", "record", f"{M}/gemm_mlp.yaml", f"{P}/gemm_mlp_tp.yaml", "-o", hup],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):  # until the write has begun
        if any(f.startswith(".hup.safetensors.tmp-") for f in os.listdir(tmp)) or p.poll() is not None:
            break
        time.sleep(0.02)
    p.send_signal(signal.SIGHUP)
    p.wait(timeout=60)
    check(not any(f.startswith(".hup.safetensors.tmp-") for f in os.listdir(tmp)), "SIGHUP left a temp file")

check.finish()
