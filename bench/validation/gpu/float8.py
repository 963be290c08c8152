#!/usr/bin/env python3
"""float8 GEMMs on one GPU (issue 48: the float8 rate the planner would price), against bf16 on the same shapes.

    float8.py OUTDIR

torch._scaled_mm (cuBLASLt) of e4m3 x e4m3 -> bf16 with tensorwise scales (one float32 each) and rowwise
scales (x's per row, W's per column), the three GEMMs of a linear (fwd x @ W^T, dgrad dY @ W with dY
in e5m2, wgrad dY^T @ X), over M in {1024, 4096, 16384} x N, K in {2048, 4096, 8192, 14336}; bf16
torch.matmul of the same shapes beside each; CUDA events after warm-up. A shape or recipe the build
refuses is recorded with its error. Rows go to OUTDIR/float8.jsonl.
"""
import json, os, sys

import torch

import gpu_rows  # noqa: E402

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
dev = torch.device("cuda")


def emit(part, row):
    gpu_rows.emit(os.path.join(OUT, "float8.jsonl"), part, row)


def timed(fn):  # 20 calls after warm-up
    return gpu_rows.timed(fn, min_reps=20, max_reps=20)


props = torch.cuda.get_device_properties(0)
emit("device", {"name": props.name, "torch": torch.__version__, "cuda": torch.version.cuda})
e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
one = torch.ones((), device=dev, dtype=torch.float32)
for m in (1024, 4096, 16384):
    for n in (2048, 4096, 8192, 14336):
        for k in (2048, 4096, 8192, 14336):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
            row = {"m": m, "n": n, "k": k}
            # bf16 reference
            row["bf16_fwd_s"] = timed(lambda: x @ w.t())
            # tensorwise: _scaled_mm takes its first operand row-major, its second column-major
            x8, w8 = x.to(e4), w.to(e4)
            wT8 = w.t().contiguous().to(e4)                              # [k, n] row-major: .t() is W column-major
            dy8, dyT8 = dy.to(e5), dy.t().contiguous().to(e5)            # dY, dY^T row-major
            xT8 = x.t().contiguous().to(e4)                              # [k, m] row-major: .t() is X column-major
            for op, fn in (("fwd", lambda: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
                           ("dgrad", lambda: torch._scaled_mm(dy8, wT8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)),
                           ("wgrad", lambda: torch._scaled_mm(dyT8, xT8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))):
                try:
                    row[f"fp8_tensorwise_{op}_s"] = timed(fn)
                except Exception as ex:  # noqa: BLE001
                    row[f"fp8_tensorwise_{op}_error"] = repr(ex)[:200]
            try:
                sa = torch.ones(m, 1, device=dev, dtype=torch.float32)
                sb = torch.ones(1, n, device=dev, dtype=torch.float32)
                row["fp8_rowwise_fwd_s"] = timed(lambda: torch._scaled_mm(x8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
            except Exception as ex:  # noqa: BLE001
                row["fp8_rowwise_error"] = repr(ex)[:200]
            row = {k2: v for k2, v in row.items() if v is not None}
            for key in list(row):
                if key.endswith("_s"):
                    row[key[:-2] + "_tflops"] = 2 * m * n * k / row[key] / 1e12
            emit("gemm", row)
            del x, w, dy, x8, w8, wT8, dy8, dyT8, xT8
