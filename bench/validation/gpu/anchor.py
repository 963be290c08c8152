#!/usr/bin/env python3
"""GPU anchor measurements with PyTorch on one H100/H200 (no ptool involved).

  anchor.py OUTDIR [gemm] [sdpa] [bw] [train]

gemm:  cuBLAS (torch.matmul) throughput over a grid of (M, N, K) and the three layouts of a
       linear's forward (x @ W^T), input gradient (dY @ W) and weight gradient (dY^T @ X);
       bf16 with fp32 accumulation; a smaller fp32 grid with TF32 off and on.
sdpa:  scaled_dot_product_attention (flash) forward and forward+backward, causal, head_dim 128.
bw:    memory-bound ops (copy, add, RMSNorm-like, SiLU*mul, cross-entropy over a 128k vocab).
train: Llama-shaped models from transformers (random init, no download) under FSDP2 fully_shard at
       world size 1 with MixedPrecisionPolicy(bf16 params, fp32 reduce), AdamW, SDPA attention,
       the HF loss (logits upcast to fp32); peak allocated/reserved per step, device memory used
       (total - free), step time.
Every row goes to OUTDIR/anchor.jsonl, one JSON object a line, with its part.

(ptool's copy of shared/gpu/anchor.py, which measured the H100 rows of 2026-11-27: it reads the
runs.json and configs.json beside it; a training run past its 300 s is recorded as an error and the
next one runs. bench/validation/gpu/measure.sh runs it with ptool calibrate on a GPU machine.)
"""
import json, os, sys, time

import torch

from gpu_rows import timed  # noqa: E402
import gpu_rows  # noqa: E402

OUT = sys.argv[1]
ONLY = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None  # one training run, in this process
PARTS = [a for a in sys.argv[2:] if a != "--only" and a != ONLY] or ["gemm", "sdpa", "bw", "train"]
os.makedirs(OUT, exist_ok=True)
dev = torch.device("cuda")


def emit(part, row):
    gpu_rows.emit(os.path.join(OUT, "anchor.jsonl"), part, row)


props = torch.cuda.get_device_properties(0)
free0, total0 = torch.cuda.mem_get_info()
emit("device", {"name": props.name, "sms": props.multi_processor_count, "total_bytes": total0,
                "free_after_context": free0, "torch": torch.__version__,
                "cuda": torch.version.cuda, "only": ONLY, "cublas_workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG")})

if "gemm" in PARTS:
    torch.backends.cuda.matmul.allow_tf32 = False
    Ms = [256, 1024, 4096, 16384]
    NKs = [256, 1024, 2048, 4096, 8192, 14336, 28672]
    for dt, grid in ((torch.bfloat16, [(m, n, k) for m in Ms for n in NKs for k in NKs]),
                     (torch.float32, [(m, n, n) for m in (1024, 8192) for n in (1024, 4096, 8192)])):
        for tf32 in ((False,) if dt == torch.bfloat16 else (False, True)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            for (m, n, k) in grid:
                x = torch.randn(m, k, device=dev, dtype=dt)
                w = torch.randn(n, k, device=dev, dtype=dt)
                dy = torch.randn(m, n, device=dev, dtype=dt)
                for layout, fn in (("fwd", lambda: x @ w.t()), ("dgrad", lambda: dy @ w),
                                   ("wgrad", lambda: dy.t() @ x)):
                    t = timed(fn)
                    emit("gemm", {"dtype": str(dt).split(".")[1], "tf32": tf32, "m": m, "n": n, "k": k,
                                  "op": layout, "seconds": t, "tflops": 2 * m * n * k / t / 1e12})
                del x, w, dy
    torch.backends.cuda.matmul.allow_tf32 = False

if "sdpa" in PARTS:
    import torch.nn.functional as F
    for (b, hq, hkv, s) in ((8, 32, 8, 1024), (4, 32, 8, 2048), (2, 32, 8, 4096), (1, 32, 8, 8192),
                            (1, 64, 8, 8192), (1, 32, 8, 16384)):
        q = torch.randn(b, hq, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(b, hkv, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(b, hkv, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(b, hq, s, 128, device=dev, dtype=torch.bfloat16)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        def fb():
            o = fwd(); o.backward(g)
        tf = timed(fwd)
        tb = timed(fb)
        flops_f = 4 * b * hq * s * s * 128 / 2
        emit("sdpa", {"b": b, "hq": hq, "hkv": hkv, "s": s, "d": 128, "fwd_s": tf, "fwd_bwd_s": tb,
                      "fwd_tflops": flops_f / tf / 1e12, "fwd_bwd_tflops": 3.5 * flops_f / tb / 1e12})
        del q, k, v, g

if "bw" in PARTS:
    import torch.nn.functional as F
    n = 1 << 28  # 256 Mi elements
    a = torch.randn(n, device=dev, dtype=torch.bfloat16); b = torch.randn_like(a)
    for name, fn, nbytes in (("copy_bf16", lambda: a.clone(), 2 * n * 2),
                             ("add_bf16", lambda: a + b, 3 * n * 2)):
        t = timed(fn); emit("bw", {"op": name, "bytes": nbytes, "seconds": t, "gb_s": nbytes / t / 1e9})
    del a, b
    x = torch.randn(16384, 4096, device=dev, dtype=torch.bfloat16); w = torch.ones(4096, device=dev, dtype=torch.bfloat16)
    rms = lambda: x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * w
    t = timed(rms); emit("bw", {"op": "rmsnorm_eager_16384x4096", "bytes": 2 * x.numel() * 2, "seconds": t, "gb_s": 2 * x.numel() * 2 / t / 1e9})
    g = torch.randn(16384, 14336, device=dev, dtype=torch.bfloat16); u = torch.randn_like(g)
    t = timed(lambda: F.silu(g) * u); emit("bw", {"op": "silu_mul_16384x14336", "bytes": 3 * g.numel() * 2, "seconds": t, "gb_s": 3 * g.numel() * 2 / t / 1e9})
    del x, g, u
    logits = torch.randn(8192, 128256, device=dev, dtype=torch.bfloat16, requires_grad=True)
    lab = torch.randint(0, 128256, (8192,), device=dev)
    def ce():
        l = F.cross_entropy(logits.float(), lab); l.backward()
    t = timed(ce); emit("bw", {"op": "cross_entropy_fp32_upcast_fwd_bwd_8192x128256", "bytes": logits.numel() * 2, "seconds": t})
    del logits

if "train" in PARTS and ONLY is None:  # each run in a fresh process: nothing left over from the one before
    import subprocess
    for run in json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.json"))):
        try:
            subprocess.run([sys.executable, os.path.abspath(__file__), OUT, "train", "--only", run["name"]], timeout=300)
        except subprocess.TimeoutExpired:
            emit("train", {"name": run["name"], "error": "timed out after 300 s"})
elif "train" in PARTS:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
    from transformers import LlamaConfig, LlamaForCausalLM
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    cfgs = json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs.json")))
    for run in [r for r in json.load(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.json"))) if r["name"] == ONLY]:
        name, batch, seq, ac = run["name"], run["batch"], run["seq"], run["ac"]
        torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated()
        try:
            torch.manual_seed(0)
            try:
                cfg = LlamaConfig(**cfgs[run["config"]])
            except Exception as e:  # RoPE scaling changes neither memory nor time
                print("config without rope_scaling:", repr(e)[:200], flush=True)
                cfg = LlamaConfig(**{k: v for k, v in cfgs[run["config"]].items() if k != "rope_scaling"})
            cfg._attn_implementation = "sdpa"; cfg.use_cache = False
            with torch.device(dev):
                model = LlamaForCausalLM(cfg)
            nparams = sum(p.numel() for p in model.parameters())
            if ac:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model.model.layers:
                fully_shard(layer, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
            steps = []
            for step in range(run.get("steps", 5)):
                torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                out = model(input_ids=ids, labels=ids)
                out.loss.backward()
                opt.step(); opt.zero_grad(set_to_none=True)
                torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                free, total = torch.cuda.mem_get_info()
                steps.append({"step": step, "seconds": dt, "loss": float(out.loss),
                              "max_allocated": torch.cuda.max_memory_allocated(),
                              "max_reserved": torch.cuda.max_memory_reserved(),
                              "allocated_after": torch.cuda.memory_allocated(),
                              "device_used": total - free})
                del out
            emit("train", {"name": name, "config": run["config"], "params": nparams, "batch": batch,
                           "seq": seq, "ac": ac, "base_allocated": base_alloc, "steps": steps})
        except torch.OutOfMemoryError as e:
            emit("train", {"name": name, "error": "OOM: " + str(e)[:300]})
        except Exception as e:  # keep going: one failing config must not lose the others
            emit("train", {"name": name, "error": repr(e)[:500]})
        finally:
            model = opt = ids = None
            import gc; gc.collect(); torch.cuda.empty_cache()
    dist.destroy_process_group()
