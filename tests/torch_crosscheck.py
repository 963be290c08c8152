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
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import torch  # noqa: E402
import yaml  # noqa: E402
from torch_model import TOLERANCE, build_model, make_optimizer, read_safetensors, train_step  # noqa: E402


class Checker:
    def __init__(self, rtol, atol):
        self.rtol, self.atol, self.failed, self.count, self.worst = rtol, atol, [], 0, 0.0
        self.bad_grads = set()  # parameters whose gradient has failed so far

    def close(self, actual, expected):
        a, e = actual.detach().double(), expected.detach().double()
        if a.shape != e.shape:
            return False, float("inf")
        headroom = ((a - e).abs() / (self.atol + self.rtol * e.abs())).max().item() if a.numel() else 0.0
        return headroom <= 1.0, headroom

    def check(self, name, actual, expected, update_ok=None):
        """update_ok: for a parameter, whether ptool's value is its optimizer's update of ptool's own
        gradients (the update rule of verify/report.h: AdamW amplifies rounding-sized gradient noise)."""
        self.count += 1
        ok, headroom = self.close(actual, expected)
        if not ok and ".grad." in name:
            self.bad_grads.add(name.split(".grad.", 1)[1])
        if not ok and update_ok is not None and name.split(".param.", 1)[1] not in self.bad_grads and update_ok():
            return
        self.worst = max(self.worst, headroom)
        if not ok:
            diff = (actual.detach().double() - expected.detach().double()).abs().max().item() if actual.shape == expected.shape else float("inf")
            self.failed.append(f"{name}: max abs err {diff:.3e}, headroom {headroom:.2f}")


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
    steps = args.steps or cfg.get("steps", 1)

    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "dump.safetensors")
        cmd = [args.ptool, "run", args.model, "--steps", str(steps), "--dump", dump, "-q"]
        subprocess.run(cmd, check=True)
        ref = read_safetensors(dump)

    model, dtype = build_model(cfg)
    state = {k[len("init.param."):]: v for k, v in ref.items() if k.startswith("init.param.")}
    state.update({k[len("init.buffer."):]: v for k, v in ref.items() if k.startswith("init.buffer.")})
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied / shared names are the same tensors under a second name: named_parameters lists the first only
    missing = [k for k in missing if k not in dict(model.named_parameters()) and not k.endswith("num_batches_tracked")
               and k not in dict(model.named_buffers())]
    if unexpected:
        raise SystemExit(f"cross-check: ptool dumped names PyTorch does not have: {unexpected}")

    params = list(model.parameters())
    opt = make_optimizer(cfg, params)
    # the shadow: torch's optimizer stepping copies of ptool's parameters with ptool's own gradients
    shadow = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    shadow_opt = make_optimizer(cfg, list(shadow.values())) if cfg.get("optimizer", {}).get("type") == "adamw" else None

    rtol, atol = TOLERANCE[dtype]
    checker = Checker(rtol, atol)
    model.train()
    for step in range(steps):
        s = f"step{step}."
        inp = ref.get(s + "input", ref.get("data.input"))
        target = ref.get(s + "target", ref.get("data.target"))
        loss, out = train_step(model, cfg, opt, inp, target, step)
        checker.check(s + "loss", ref[s + "loss"], loss)
        checker.check(s + "output", ref[s + "output"], out)
        if train_step.grad_norm is not None:
            checker.check(s + "grad_norm", ref[s + "grad_norm"], train_step.grad_norm.to(torch.float64).reshape(()))
        if shadow_opt:
            for name, t in shadow.items():
                t.grad = ref[s + "grad." + name].clone()
            shadow_opt.step()
        for name, p in model.named_parameters():
            checker.check(s + "grad." + name, ref[s + "grad." + name], p.grad)
            update_ok = (lambda n=name: checker.close(ref[s + "param." + n], shadow[n])[0]) if shadow_opt else None
            checker.check(s + "param." + name, ref[s + "param." + name], p, update_ok)
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
