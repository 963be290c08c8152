#!/usr/bin/env python3
"""bench_torch: ptool's training step against PyTorch's on the same device, same model and step.

    bench/bench_torch.py [--device cpu|cuda] [--config CONFIG.json] [--batch B] [--seq S]
                         [--layers N] [--steps N] [--build build] [--python PYTHON]

ptool: `ptool import hf CONFIG` at the batch and sequence, then bench_step (bench/bench_step.cpp):
the time from launch to the first step, the steady step, the peak memory and the step's GEMMs at the
sgemm (cuBLAS) rate measured in the same run. On cuda under fully_shard of every decoder layer and
the root at dp 1 with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32); on the CPU
in float32 on one device (`ptool run`'s step).
PyTorch: the same model (transformers' LlamaForCausalLM / Qwen2ForCausalLM where transformers is
importable, else tools/torch_model.py's build of the same YAML: HF's modules written out), AdamW,
HF's loss; on cuda with PyTorch >= 2.4, FSDP2's fully_shard at world size 1 with the same policy
(as /work/shared/gpu/anchor.py measured 0.2276 s for Llama-3.2-1B at 4 x 2048 on an H100); on the
CPU, Debian's PyTorch (1.13) in float32 on every core. Prints both steps, their ratio and peaks.
Never run in CI (minutes); the GPU half is scripts/gpu_checks.sh's `bench` step.

Defaults: cuda: bench/llama-3.2-1b.config.json (the shared Llama-3.2-1B config) at 4 x 2048;
cpu: tests/data/hf/qwen2-0.5b.json at 1 x 256.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ptool_side(args, model_yaml, plan_yaml):
    cmd = [os.path.join(args.build, "bench", "bench_step"), model_yaml, plan_yaml or "-", args.device, str(args.steps)]
    print("$", " ".join(cmd), flush=True)
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.stdout.write(out.stderr)
        raise SystemExit(f"bench_step failed ({out.returncode})")
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return {k: float(v) for k, v in re.findall(r"(\w+)=(\S+)", line)}


def torch_model(args, cfg, model_yaml, torch):
    """transformers' model of the config where it is importable, else the YAML's modules."""
    try:
        import transformers  # noqa: F401
        from transformers import AutoConfig, AutoModelForCausalLM
        conf = AutoConfig.for_model(**cfg)
        conf._attn_implementation = "sdpa"
        conf.use_cache = False
        model = AutoModelForCausalLM.from_config(conf)
        return model, lambda m, ids: m(input_ids=ids, labels=ids).loss, "transformers"
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import yaml
        import torch_model as tm
        spec = yaml.safe_load(open(model_yaml))
        model, _ = tm.build_model(spec)
        F = torch.nn.functional

        def loss(m, ids):  # HF's: the logits against the next token (ptool's targets are its data's)
            logits = m(ids)
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), ids[:, 1:].reshape(-1))
        return model, loss, "tools/torch_model.py"


def torch_side(args, cfg, model_yaml):
    try:
        import torch
    except ImportError:
        print("PyTorch: not importable with", args.python or sys.executable, "- ptool's numbers only")
        return None
    version = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    cuda = args.device == "cuda"
    if cuda and (version < (2, 4) or not torch.cuda.is_available()):
        print(f"PyTorch {torch.__version__}: FSDP2 needs >= 2.4 and a GPU - ptool's numbers only")
        return None
    if not cuda:
        torch.set_num_threads(os.cpu_count() or 1)
    dev = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    t_launch = time.perf_counter()
    with torch.device(dev) if hasattr(torch, "device") and cuda else _null():
        model, loss_of, source = torch_model(args, cfg, model_yaml, torch)
    model = model.to(dev)
    if cuda:
        import torch.distributed as dist
        try:
            from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard, MixedPrecisionPolicy
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29531")
        dist.init_process_group("nccl", rank=0, world_size=1)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        layers = model.model.layers if hasattr(model, "model") else getattr(model, "layers", [])
        for layer in layers:
            fully_shard(layer, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters())  # torch's defaults, as the imported YAML's optimizer
    ids = torch.randint(0, cfg["vocab_size"], (args.batch, args.seq), device=dev)
    times, peaks, first = [], [], None
    for step in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        if first is None:
            first = t0 - t_launch
        loss = loss_of(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        peaks.append(torch.cuda.max_memory_allocated() if cuda else
                     resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        print(f"torch step {step}  loss {float(loss):.6g}  {times[-1] * 1e3:.1f} ms", flush=True)
    if cuda:
        import torch.distributed as dist
        dist.destroy_process_group()
    steady = min(times[1:]) if len(times) > 1 else times[0]
    return {"step_s": steady, "peak_bytes": max(peaks), "first_step_s": first, "source": source,
            "version": torch.__version__}


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--config")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--layers", type=int, help="num_hidden_layers (a scaled config)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", help="run PyTorch's side with this interpreter (default: this one)")
    ap.add_argument("--torch-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-yaml", help=argparse.SUPPRESS)
    args = ap.parse_args()
    cuda = args.device == "cuda"
    args.config = args.config or os.path.join(ROOT, "bench/llama-3.2-1b.config.json" if cuda else
                                              "tests/data/hf/qwen2-0.5b.json")
    args.batch = args.batch or (4 if cuda else 1)
    args.seq = args.seq or (2048 if cuda else 256)
    cfg = json.load(open(args.config))
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    if args.torch_only:  # the PyTorch side in another interpreter: one JSON line
        print("TORCH " + json.dumps(torch_side(args, cfg, args.model_yaml)))
        return
    tmp = tempfile.mkdtemp(prefix="bench_torch.")
    config = os.path.join(tmp, "config.json")
    json.dump(cfg, open(config, "w"))
    model_yaml = os.path.join(tmp, "model.yaml")
    subprocess.run([os.path.join(args.build, "cli", "ptool"), "import", "hf", config, "--batch", str(args.batch),
                    "--seq", str(args.seq), "-o", model_yaml], check=True)
    plan_yaml = None
    if cuda:
        plan_yaml = os.path.join(tmp, "plan.yaml")
        with open(plan_yaml, "w") as f:
            f.write("# fully_shard of every decoder layer and the root at dp 1, bf16 mixed precision\n"
                    "mesh: {dp: 1}\ndata_parallel:\n  mesh_dim: dp\n  mode: fully_shard\n"
                    "  fully_shard: [\"model.layers.*\"]\n"
                    "  mixed_precision: {param_dtype: bfloat16, reduce_dtype: float32}\n")
    print(f"bench_torch: {os.path.basename(args.config)} ({cfg['num_hidden_layers']} layers) at "
          f"{args.batch} x {args.seq} tokens on {args.device}", flush=True)
    p = ptool_side(args, model_yaml, plan_yaml)
    if args.python and os.path.realpath(args.python) != os.path.realpath(sys.executable):
        out = subprocess.run([args.python, os.path.abspath(__file__), "--torch-only", "--model-yaml", model_yaml,
                              "--device", args.device, "--config", config, "--batch", str(args.batch),
                              "--seq", str(args.seq), "--steps", str(args.steps)],
                             capture_output=True, text=True, check=False)
        sys.stdout.write("".join(l + "\n" for l in out.stdout.splitlines() if not l.startswith("TORCH ")))
        lines = [l for l in out.stdout.splitlines() if l.startswith("TORCH ")]
        t = json.loads(lines[-1][6:]) if lines else None
        if not lines:
            sys.stdout.write(out.stderr[-2000:])
    else:
        t = torch_side(args, cfg, model_yaml)
    gib = 1024 ** 3
    print(f"ptool   step {p['step_s'] * 1e3:9.1f} ms  peak {p['peak_bytes'] / gib:6.2f} GiB  "
          f"first step {p['first_step_s']:.2f} s after launch")
    print(f"GEMMs at the {'cuBLAS' if cuda else 'sgemm'} rate of the same run: {p['gemm_s'] * 1e3:.1f} ms "
          f"({p['gemm_flops'] / p['gemm_s'] / 1e9:.1f} GFLOP/s): ptool's step is {p['step_s'] / p['gemm_s']:.2f}x "
          f"(target <= 2x on the CPU)")
    if t:
        print(f"PyTorch {t['version']} ({t['source']}) step {t['step_s'] * 1e3:9.1f} ms  "
              f"peak {t['peak_bytes'] / gib:6.2f} GiB  first step {t['first_step_s']:.2f} s after building")
        print(f"ratio ptool / PyTorch: {p['step_s'] / t['step_s']:.2f}x (target <= 1.5x on a GPU)")


if __name__ == "__main__":
    main()
