#!/usr/bin/env python3
"""A kernel table (docs/kernel_table.md) from the rows PyTorch measured on a GPU (anchor.py's jsonl).

    tools/kernel_table_from_anchor.py ANCHOR.jsonl OUT.json --gpu NAME --date DATE --software TEXT
        [--peak-bf16 TFLOPS] [--peak-fp32 TFLOPS] [--peak-float8 TFLOPS] [--bandwidth GB_S] [--source TEXT]
        [--float8 FLOAT8.jsonl]
        [--float8-ratio-from FLOAT8.jsonl --float8-ratio-bf16 TABLE.json]

Reads the `device`, `gemm`, `sdpa`, `bw` and `floor` rows of ANCHOR.jsonl and writes the table ptool's
cluster files name (`kernels:`), one row a line, with where every number came from:

  gemm       every bf16 and fp32 (TF32 off) row: dtype, op (fwd/dgrad/wgrad), m, n, k, seconds;
             with --float8, every float8 tensorwise row of bench/validation/gpu/float8.py's jsonl
             (torch._scaled_mm, e4m3fn x e4m3fn forward, e5m2 x e4m3fn gradients, bf16 out): dtype
             bfloat16 (the output's), float8 "tensorwise", op, m, n, k, seconds;
             with --float8-ratio-from, float8 rows DERIVED, not measured, for a GPU of the same compute
             die as the one that measured FLOAT8.jsonl (H100 SXM from the H200's: GH100, 132 SMs, the
             same clocks and tensor-core peaks; only the memory differs): per shape and op, this GPU's
             bf16 row x (the other GPU's float8 seconds / its bf16 seconds of the same shape and op,
             the bf16 from TABLE.json, that GPU's kernel table measured by the same anchor.py as
             ANCHOR.jsonl: float8.py times bf16 forward only). Only shapes ANCHOR.jsonl measured
             (no interpolation); the provenance says the rows are derived and what is assumed
  attention  every sdpa row: causal flash attention, bf16, batch, heads, kv_heads, seq, head_dim,
             forward seconds and forward+backward seconds
  memory     copy (the streaming bandwidth the derived ops are priced at), add, the eager RMSNorm's
             forward, SiLU x mul's forward, the loss's forward and backward with its float32 upcast
  device     the device's memory and what the CUDA context took (total minus free after it)
  kernel_overhead  the median launch-bound eager call (`floor` rows, bench/validation/gpu/overhead.py)
             where measured, else derived from the eager RMSNorm's excess over its bytes

The peak rates are the vendor's (dense), the scale a cluster of another GPU is derived by; the float8
peak (--peak-float8, default the H100 SXM's and H200's 1979) is written where the table has float8 rows
(their scale, as the bf16 peak is the bf16 rows').
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("anchor")
    ap.add_argument("out")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--software", required=True)
    ap.add_argument("--source", default="")
    ap.add_argument("--peak-bf16", type=float, default=989)
    ap.add_argument("--peak-fp32", type=float, default=67)
    ap.add_argument("--peak-float8", type=float, default=1979)
    ap.add_argument("--bandwidth", type=float, default=3350)
    ap.add_argument("--float8", default="")
    ap.add_argument("--float8-ratio-from", default="")
    ap.add_argument("--float8-ratio-bf16", default="")
    a = ap.parse_args()
    if bool(a.float8_ratio_from) != bool(a.float8_ratio_bf16) or (a.float8 and a.float8_ratio_from):
        ap.error("--float8-ratio-from takes --float8-ratio-bf16, and neither goes with --float8")
    rows = [json.loads(line) for line in open(a.anchor) if line.strip()]
    device = next(r for r in rows if r["part"] == "device")
    gemm = [r for r in rows if r["part"] == "gemm" and not r.get("tf32")]
    sdpa = [r for r in rows if r["part"] == "sdpa"]
    bw = {r["op"]: r for r in rows if r["part"] == "bw"}

    def mem(op, dtype, elements, r):
        return {"op": op, "dtype": dtype, "elements": elements, "bytes": r["bytes"], "seconds": r["seconds"]}

    memory = []
    if "copy_bf16" in bw:
        memory.append(mem("copy", "bfloat16", bw["copy_bf16"]["bytes"] // 4, bw["copy_bf16"]))
    if "add_bf16" in bw:
        memory.append(mem("add", "bfloat16", bw["add_bf16"]["bytes"] // 6, bw["add_bf16"]))
    for op, r in bw.items():
        if op.startswith("rmsnorm_eager_"):
            rr, cc = (int(x) for x in op.rsplit("_", 1)[1].split("x"))
            memory.append(mem("rms_norm_eager_fwd", "bfloat16", rr * cc, r))
        elif op.startswith("silu_mul_"):
            rr, cc = (int(x) for x in op.rsplit("_", 1)[1].split("x"))
            memory.append(mem("silu_mul_fwd", "bfloat16", rr * cc, r))
        elif op.startswith("cross_entropy_fp32_upcast_fwd_bwd_"):
            rr, cc = (int(x) for x in op.rsplit("_", 1)[1].split("x"))
            memory.append(mem("cross_entropy", "bfloat16", rr * cc, r))

    # The fixed cost of a memory-bound kernel (time = alpha + bytes / bandwidth). Measured where the
    # rows have it: back-to-back eager element-wise calls too small for their bytes to matter (at the
    # copy's bandwidth under a tenth of the call: launch and dispatch), their median per call
    # (bench/validation/gpu/overhead.py's `floor` rows). Else derived from the eager RMSNorm's
    # measurement: its 8 kernels (to, pow, mean, add, rsqrt, mul, to, mul) move 36 bytes per element
    # of a bf16 input; what the measured time exceeds those bytes at the copy's bandwidth by, per kernel.
    overhead = None
    if "copy_bf16" in bw:
        copy_bw = bw["copy_bf16"]["bytes"] / bw["copy_bf16"]["seconds"]
        launch_bound = [r for r in rows if r["part"] == "floor" and r["bytes"] / copy_bw < 0.1 * r["seconds"]]
        if launch_bound:
            ops = sorted({r["op"] for r in rows if r["part"] == "floor"})
            sizes = sorted({r["elements"] for r in launch_bound})
            overhead = {"seconds": statistics.median(r["seconds"] for r in launch_bound),
                        "source": f"measured: the median of {len(launch_bound)} back-to-back eager calls "
                                  f"({', '.join(ops)}; {sizes[0]} to {sizes[-1]} bf16 elements, each launch-bound: "
                                  f"its bytes at copy_bf16's {copy_bw / 1e9:.0f} GB/s under a tenth of the call), "
                                  "per kernel"}
        for op, r in bw.items():
            if op.startswith("rmsnorm_eager_") and overhead is None:
                rr, cc = (int(x) for x in op.rsplit("_", 1)[1].split("x"))
                alpha = (r["seconds"] - 36 * rr * cc / copy_bw) / 8
                overhead = {"seconds": max(0.0, alpha),
                            "source": f"derived from {op}: its measured {r['seconds'] * 1e6:.1f} us less its 8 "
                                      f"kernels' 36 bytes per element at copy_bf16's {copy_bw / 1e9:.0f} GB/s, "
                                      "per kernel"}
    lines = ['{',
             '  "format": "ptool kernel table 1",',
             f'  "gpu": {json.dumps(a.gpu)},',
             '  "peak": ' + json.dumps({"tflops": {"bfloat16": a.peak_bf16, "float16": a.peak_bf16,
                                                  "float32": a.peak_fp32,
                                                  **({"float8": a.peak_float8}
                                                     if a.float8 or a.float8_ratio_from else {})},
                                       "memory_bandwidth_gb_s": a.bandwidth}) + ',',
             '  "device": ' + json.dumps({"name": device["name"], "sms": device["sms"],
                                         "memory_bytes": device["total_bytes"],
                                         "context_bytes": device["total_bytes"] - device["free_after_context"]}) + ',',
             '  "provenance": ' + json.dumps({
                 "measured": a.date, "software": a.software,
                 "by": "PyTorch: torch.matmul (cuBLAS) per GEMM layout, scaled_dot_product_attention (flash, "
                       "causal, enable_gqa), eager memory-bound ops; CUDA events after warm-up",
                 "source": a.source,
                 **({"float8": f"{a.float8} (bench/validation/gpu/float8.py: torch._scaled_mm, tensorwise)"}
                    if a.float8 else {}),
                 **({"float8": "DERIVED, not measured on this GPU: per shape and op, this table's bf16 row x "
                               f"(float8 seconds / bf16 seconds) of another GPU's, the float8 from {a.float8_ratio_from} "
                               "(bench/validation/gpu/float8.py: torch._scaled_mm, tensorwise), the bf16 from "
                               f"{a.float8_ratio_bf16} (anchor.py, as this table's); assumed: the same compute die "
                               "and clocks (H100 SXM and H200: GH100, 132 SMs, 989 bf16 / 1979 float8 dense TFLOP/s; "
                               "only the memory differs), so float8's speed-up over bf16 of a GEMM carries over; "
                               "only the shapes measured there, no interpolation (tools/kernel_table_from_anchor.py "
                               "--float8-ratio-from)"}
                    if a.float8_ratio_from else {}),
                 "converted_by": "tools/kernel_table_from_anchor.py"}) + ',']
    if overhead:
        lines.append('  "kernel_overhead": ' + json.dumps(overhead) + ',')
    lines += ['  "gemm": [']
    g = [json.dumps({"dtype": r["dtype"], "op": r["op"], "m": r["m"], "n": r["n"], "k": r["k"],
                     "seconds": r["seconds"]}) for r in gemm]
    float8 = [json.loads(line) for line in open(a.float8) if line.strip()] if a.float8 else []
    for r in (r for r in float8 if r["part"] == "gemm"):
        for op in ("fwd", "dgrad", "wgrad"):
            g.append(json.dumps({"dtype": "bfloat16", "float8": "tensorwise", "op": op, "m": r["m"], "n": r["n"],
                                 "k": r["k"], "seconds": r[f"fp8_tensorwise_{op}_s"]}))
    if a.float8_ratio_from:
        here = {(r["dtype"], r["op"], r["m"], r["n"], r["k"]): r["seconds"] for r in gemm}
        there = {(r["dtype"], r["op"], r["m"], r["n"], r["k"]): r["seconds"]
                 for r in json.load(open(a.float8_ratio_bf16))["gemm"] if "float8" not in r}
        for r in (json.loads(line) for line in open(a.float8_ratio_from) if line.strip()):
            if r["part"] != "gemm":
                continue
            for op in ("fwd", "dgrad", "wgrad"):
                key = ("bfloat16", op, r["m"], r["n"], r["k"])
                if f"fp8_tensorwise_{op}_s" not in r or key not in here or key not in there:
                    continue  # a shape not measured on both GPUs is left out, not interpolated
                g.append(json.dumps({"dtype": "bfloat16", "float8": "tensorwise", "op": op, "m": r["m"],
                                     "n": r["n"], "k": r["k"],
                                     "seconds": here[key] * r[f"fp8_tensorwise_{op}_s"] / there[key]}))
    lines += ["    " + x + ("," if i + 1 < len(g) else "") for i, x in enumerate(g)]
    lines.append('  ],')
    lines.append('  "attention": [')
    s = [json.dumps({"dtype": "bfloat16", "causal": True, "batch": r["b"], "heads": r["hq"], "kv_heads": r["hkv"],
                     "seq": r["s"], "head_dim": r["d"], "fwd_seconds": r["fwd_s"],
                     "fwd_bwd_seconds": r["fwd_bwd_s"]}) for r in sdpa]
    lines += ["    " + x + ("," if i + 1 < len(s) else "") for i, x in enumerate(s)]
    lines.append('  ],')
    lines.append('  "memory": [')
    m = [json.dumps(x) for x in memory]
    lines += ["    " + x + ("," if i + 1 < len(m) else "") for i, x in enumerate(m)]
    lines.append('  ]')
    lines.append('}')
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(g)} GEMMs ({len(g) - len(gemm)} float8), {len(sdpa)} attention rows, {len(memory)} memory ops")


if __name__ == "__main__":
    main()
