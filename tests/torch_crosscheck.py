#!/usr/bin/env python3
"""PyTorch cross-check of ptool's single-device reference.

Builds MODEL in PyTorch from the same YAML, loads the initial parameters, buffers and data that
`ptool run --dump` wrote, runs the same training steps with torch.optim, and compares loss,
output, every gradient, every updated parameter and every buffer with torch.testing's rule
|a - e| <= atol + rtol * |e| (fp32: rtol 1.3e-6, atol 1e-5).

    python3 tests/torch_crosscheck.py --ptool build/cli/ptool models/mlp.yaml
Exit 0 when everything agrees, 1 on a mismatch. Needs Debian's python3-torch and python3-yaml.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
          "I64": torch.int64, "I32": torch.int32}
MODEL_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
                "float16": torch.float16}
TOLERANCE = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-5),
             torch.float16: (1e-3, 1e-5)}


def read_safetensors(path):
    """A minimal safetensors reader (the `safetensors` package is not in Debian)."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = bytearray(data[base + begin:base + end])
        t = torch.frombuffer(buf, dtype=DTYPES[info["dtype"]]) if buf else torch.empty(0, dtype=DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


class Seq(nn.Module):
    """A container whose children run in order (nn.Sequential with explicit names)."""

    def __init__(self, children):
        super().__init__()
        self.order = []
        for name, mod in children:
            self.add_module(name, mod)
            self.order.append(name)

    def forward(self, x):
        for name in self.order:
            x = getattr(self, name)(x)
        return x


class Residual(Seq):
    def forward(self, x):
        return x + super().forward(x)


class RMSNorm(nn.Module):
    """nn.RMSNorm (PyTorch >= 2.4): y = x * rsqrt(mean(x^2) + eps) * weight."""

    def __init__(self, dim, eps, affine):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight if self.weight is not None else y


class LayerNorm(nn.Module):
    def __init__(self, dim, eps, affine, bias):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, causal, bias):
        super().__init__()
        self.heads, self.kv_heads, self.causal, self.hd = heads, kv_heads, causal, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj = nn.Linear(dim, self.hd * kv_heads, bias=bias)
        self.v_proj = nn.Linear(dim, self.hd * kv_heads, bias=bias)
        self.o_proj = nn.Linear(dim, dim, bias=bias)

    def forward(self, x):
        b, t, c = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            s = s.masked_fill(~mask, float("-inf"))
        o = s.softmax(-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(b, t, c))


class GatedMlp(nn.Module):
    def __init__(self, dim, hidden, act, bias):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


ACTS = {"silu": nn.SiLU(), "relu": nn.ReLU(), "gelu": nn.GELU(), "tanh": nn.Tanh()}
FINFO_EPS = {torch.float32: torch.finfo(torch.float32).eps, torch.float64: torch.finfo(torch.float64).eps,
             torch.bfloat16: torch.finfo(torch.bfloat16).eps, torch.float16: torch.finfo(torch.float16).eps}


def build(spec, prefix, registry, dtype):
    t = spec["type"]
    fqn = f"{prefix}.{spec['name']}" if prefix else spec["name"]
    if t == "linear":
        m = nn.Linear(spec["in"], spec["out"], bias=spec.get("bias", True))
        if "tie" in spec:
            m.weight = registry[spec["tie"]].weight
    elif t in ("relu", "silu", "tanh"):
        m = ACTS[t]
    elif t == "gelu":
        m = nn.GELU(approximate=spec.get("approximate", "none"))
    elif t == "identity":
        m = nn.Identity()
    elif t == "layer_norm":
        m = LayerNorm(spec["dim"], float(spec.get("eps", 1e-5)), spec.get("elementwise_affine", True), spec.get("bias", True))
    elif t == "rms_norm":
        m = RMSNorm(spec["dim"], float(spec.get("eps", FINFO_EPS[dtype])), spec.get("elementwise_affine", True))
    elif t == "batch_norm":
        m = nn.BatchNorm1d(spec["features"], eps=float(spec.get("eps", 1e-5)), momentum=spec.get("momentum", 0.1))
    elif t == "embedding":
        m = nn.Embedding(spec["vocab"], spec["dim"])
    elif t == "dropout":
        if spec.get("p", 0.5) != 0:
            raise SystemExit("cross-check: dropout masks come from ptool's counter-based RNG; use p: 0 here")
        m = nn.Dropout(0.0)
    elif t == "attention":
        m = Attention(spec["dim"], spec["heads"], spec.get("kv_heads", spec["heads"]), spec.get("causal", False),
                      spec.get("bias", True))
    elif t == "gated_mlp":
        m = GatedMlp(spec["dim"], spec["hidden"], ACTS[spec.get("activation", "silu")], spec.get("bias", False))
    elif t in ("sequential", "residual"):
        cls = Residual if t == "residual" else Seq
        m = cls([(c["name"], build(c, fqn, registry, dtype)) for c in spec["modules"]])
    elif t == "repeat":
        copies = []
        for i in range(spec["count"]):
            cf = f"{fqn}.{i}"
            copy = Seq([(c["name"], build(c, cf, registry, dtype)) for c in spec["modules"]])
            registry[cf] = copy
            copies.append((str(i), copy))
        m = Seq(copies)
    elif t == "shared":
        return registry[spec["module"]]
    else:
        raise SystemExit(f"cross-check: unknown module type {t}")
    registry[fqn] = m
    return m


def compute_loss(kind, out, target):
    if kind == "sum":
        return out.sum()
    if kind == "mean":
        return out.mean()
    if kind == "mse":
        return F.mse_loss(out, target)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


class Checker:
    def __init__(self, rtol, atol):
        self.rtol, self.atol, self.failed, self.count, self.worst = rtol, atol, [], 0, 0.0

    def check(self, name, actual, expected):
        self.count += 1
        a, e = actual.detach().double(), expected.detach().double()
        if a.shape != e.shape:
            self.failed.append(f"{name}: shape {list(a.shape)} vs {list(e.shape)}")
            return
        bound = self.atol + self.rtol * e.abs()
        headroom = ((a - e).abs() / bound).max().item() if a.numel() else 0.0
        self.worst = max(self.worst, headroom)
        if headroom > 1.0:
            self.failed.append(f"{name}: max abs err {(a - e).abs().max().item():.3e}, headroom {headroom:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ptool", required=True, help="the ptool binary")
    ap.add_argument("--steps", type=int, default=0)
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    with open(args.model) as f:
        cfg = yaml.safe_load(f)
    dtype = MODEL_DTYPES[cfg.get("dtype", "float32")]
    steps = args.steps or cfg.get("steps", 1)

    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "dump.safetensors")
        cmd = [args.ptool, "run", args.model, "--steps", str(steps), "--dump", dump, "-q"]
        subprocess.run(cmd, check=True)
        ref = read_safetensors(dump)

    registry = {}
    model = Seq([(c["name"], build(c, "", registry, dtype)) for c in cfg["modules"]]).to(dtype)
    state = {k[len("init.param."):]: v for k, v in ref.items() if k.startswith("init.param.")}
    state.update({k[len("init.buffer."):]: v for k, v in ref.items() if k.startswith("init.buffer.")})
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied / shared names are the same tensors under a second name: named_parameters lists the first only
    missing = [k for k in missing if k not in dict(model.named_parameters()) and not k.endswith("num_batches_tracked")
               and k not in dict(model.named_buffers())]
    if unexpected:
        raise SystemExit(f"cross-check: ptool dumped names PyTorch does not have: {unexpected}")

    # PyYAML follows YAML 1.1, where 1e-6 (no dot) is a string; ptool reads it as a number
    opt_cfg = {k: (float(v) if k in ("lr", "momentum", "weight_decay", "eps") else v)
               for k, v in cfg.get("optimizer", {"type": "sgd"}).items()}
    params = list(model.parameters())
    if not params:  # a parameter-free model (identity): torch.optim refuses an empty list
        opt = None
    elif opt_cfg["type"] == "sgd":
        opt = torch.optim.SGD(params, lr=opt_cfg.get("lr", 1e-3), momentum=opt_cfg.get("momentum", 0.0),
                              weight_decay=opt_cfg.get("weight_decay", 0.0), foreach=False)
    else:
        opt = torch.optim.AdamW(params, lr=opt_cfg.get("lr", 1e-3), betas=tuple(opt_cfg.get("betas", (0.9, 0.999))),
                                eps=opt_cfg.get("eps", 1e-8), weight_decay=opt_cfg.get("weight_decay", 1e-2),
                                foreach=False)

    rtol, atol = TOLERANCE[dtype]
    checker = Checker(rtol, atol)
    model.train()
    for step in range(steps):
        s = f"step{step}."
        inp = ref.get(s + "input", ref.get("data.input"))
        target = ref.get(s + "target", ref.get("data.target"))
        if opt:
            opt.zero_grad(set_to_none=False)
        out = model(inp)
        loss = compute_loss(cfg.get("loss", "sum"), out, target)
        if loss.requires_grad:
            loss.backward()
        if opt:
            opt.step()
        checker.check(s + "loss", ref[s + "loss"], loss)
        checker.check(s + "output", ref[s + "output"], out)
        for name, p in model.named_parameters():
            checker.check(s + "grad." + name, ref[s + "grad." + name], p.grad)
            checker.check(s + "param." + name, ref[s + "param." + name], p)
        for name, b in model.named_buffers():
            checker.check(s + "buffer." + name, ref[s + "buffer." + name], b)

    name = os.path.basename(args.model)
    if checker.failed:
        print(f"{name}: {len(checker.failed)} of {checker.count} tensors differ from PyTorch {torch.__version__}:")
        for line in checker.failed:
            print("  " + line)
        return 1
    print(f"{name}: {checker.count} tensors agree with PyTorch {torch.__version__} over {steps} steps "
          f"(rtol {rtol}, atol {atol}; worst headroom {checker.worst:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
