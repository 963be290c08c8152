#!/usr/bin/env python3
"""What an eager PyTorch step spends besides its kernels' bytes, on one GPU (issue 47's kernel overhead).

    overhead.py OUTDIR

floor:   back-to-back element-wise ops (copy, add, mul) at sizes 2^10 .. 2^26 bf16 elements, timed with
         CUDA events after warm-up: per call, what a small kernel costs in eager mode (launch and
         dispatch), where the curve leaves the bandwidth line.
profile: the 1B Llama step of configs.json/runs.json's first run (FSDP2 at world size 1, bf16 mixed
         precision, AdamW foreach, HF's loss) under torch.profiler: the kernels' summed GPU time by
         kind, their count, and the step's wall time; the rest is where the GPU waited.
Rows go to OUTDIR/overhead.jsonl.
"""
import json, os, sys, time

import torch

import gpu_rows  # noqa: E402

OUT = sys.argv[1]
os.makedirs(OUT, exist_ok=True)
dev = torch.device("cuda")


def emit(part, row):
    gpu_rows.emit(os.path.join(OUT, "overhead.jsonl"), part, row)


def per_call(fn, reps=200):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 1e3 / reps, (time.perf_counter() - t0) / reps


for log2 in range(10, 27, 2):
    n = 1 << log2
    a = torch.randn(n, device=dev, dtype=torch.bfloat16)
    b = torch.randn_like(a)
    for op, fn, nbytes in (("copy", lambda: a.clone(), 4 * n), ("add", lambda: a + b, 6 * n), ("mul", lambda: a * b, 6 * n)):
        gpu_s, wall_s = per_call(fn)
        emit("floor", {"op": op, "elements": n, "bytes": nbytes, "seconds": gpu_s, "wall_per_call": wall_s})
    del a, b

import torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.profiler import profile, ProfilerActivity
from transformers import LlamaConfig, LlamaForCausalLM

here = os.path.dirname(os.path.abspath(__file__))
os.environ.setdefault("MASTER_ADDR", "127.0.0.1"); os.environ.setdefault("MASTER_PORT", "29518")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
run = json.load(open(os.path.join(here, "runs.json")))[0]
cfg = LlamaConfig(**json.load(open(os.path.join(here, "configs.json")))[run["config"]])
cfg._attn_implementation = "sdpa"; cfg.use_cache = False
torch.manual_seed(0)
with torch.device(dev):
    model = LlamaForCausalLM(cfg)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model.model.layers:
    fully_shard(layer, mp_policy=mp)
fully_shard(model, mp_policy=mp)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
ids = torch.randint(0, cfg.vocab_size, (run["batch"], run["seq"]), device=dev)


def step():
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step(); opt.zero_grad(set_to_none=True)
    del out


for _ in range(3):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
kinds = {}
count = 0
busy = 0.0
for ev in prof.events():
    if ev.device_type == torch.autograd.DeviceType.CUDA:
        us = ev.device_time if hasattr(ev, "device_time") else ev.cuda_time
        name = ev.name.lower()
        kind = ("gemm" if any(k in name for k in ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")) else
                "attention" if "flash" in name or "fmha" in name else
                "nccl" if "nccl" in name else
                "memcpy" if "memcpy" in name or "memset" in name else "other")
        k = kinds.setdefault(kind, [0, 0.0])
        k[0] += 1; k[1] += us / 1e6
        count += 1; busy += us / 1e6
emit("profile", {"run": run["name"], "wall_seconds": wall, "kernels": count, "kernel_seconds": busy,
                 "by_kind": {k: {"count": v[0], "seconds": v[1]} for k, v in kinds.items()}})
# the kernels' own seconds by name (the 40 largest), for where the time goes
table = {}
for ev in prof.key_averages():
    t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
    if t and ev.count:
        table[ev.key] = (ev.count, t / 1e6)
for name, (n, s) in sorted(table.items(), key=lambda x: -x[1][1])[:40]:
    emit("profile_op", {"name": name[:120], "count": n, "seconds": s})
dist.destroy_process_group()
