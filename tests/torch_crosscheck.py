#!/usr/bin/env python3
"""PyTorch cross-check of ptool's single-device reference.

Builds MODEL in PyTorch from the same YAML, loads the initial parameters, buffers and data that
`ptool run --dump` wrote, runs the same training steps with torch.optim, and compares loss,
output, every gradient, every updated parameter and every buffer with torch.testing's rule
|a - e| <= atol + rtol * |e| (fp32: rtol 1.3e-6, atol 1e-5).

    python3 tests/torch_crosscheck.py --ptool build/cli/ptool models/mlp.yaml
Exit 0 when everything agrees, 1 on a mismatch. A key on one side only is a mismatch: a tensor of
PyTorch's model (an initial parameter or buffer, a step's gradient, parameter or buffer) that
ptool's dump lacks, and a tensor ptool dumped that nothing here compares. --tamper drop:KEY or
add:KEY edits the dump before the comparison, to show that both are caught (tests/CMakeLists.txt).
Needs Debian's python3-torch and python3-yaml.
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


class Dump:
    """ptool's dumped tensors, remembering which keys were read: what is left unread at the end has
    no PyTorch counterpart here; get() of a key ptool did not dump is None."""

    def __init__(self, tensors):
        self.tensors, self.read = tensors, set()

    def get(self, key):
        self.read.add(key)
        return self.tensors.get(key)

    def first(self, *keys):  # the first of keys that ptool dumped (a step's own data, or the shared data)
        for key in keys:
            if key in self.tensors:
                return self.get(key)
        return self.get(keys[-1])

    def unread(self):
        return sorted(set(self.tensors) - self.read)


class Checker:
    def __init__(self, rtol, atol):
        self.rtol, self.atol, self.failed, self.count, self.worst = rtol, atol, [], 0, 0.0
        self.one_sided = []  # keys on one side only: each a failure of its own
        self.bad_grads = set()  # parameters whose gradient has failed so far

    def close(self, actual, expected):
        a, e = actual.detach().double(), expected.detach().double()
        if a.shape != e.shape:
            return False, float("inf")
        headroom = ((a - e).abs() / (self.atol + self.rtol * e.abs())).max().item() if a.numel() else 0.0
        return headroom <= 1.0, headroom

    def check(self, name, actual, expected, update_ok=None):
        """update_ok: for a parameter, whether ptool's value is its optimizer's update of ptool's own
        gradients (the update rule of verify/report.h: AdamW amplifies rounding-sized gradient noise).
        actual None: ptool dumped no such tensor; expected None: PyTorch computed none."""
        if actual is None or expected is None:
            self.one_sided.append(f"{name}: " + ("missing from ptool's dump" if actual is None else "PyTorch computed no such tensor"))
            return
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
    ap.add_argument("--tamper", action="append", default=[], metavar="drop:KEY|add:KEY",
                    help="edit ptool's dump before comparing (a test that a key on one side only fails)")
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
        tensors = read_safetensors(dump)
    for t in args.tamper:
        how, _, key = t.partition(":")
        if how == "drop":
            if key not in tensors:
                raise SystemExit(f"--tamper drop:{key}: ptool dumped no such key")
            del tensors[key]
        elif how == "add":
            tensors[key] = torch.zeros(1)
        else:
            raise SystemExit(f"--tamper {t}: drop:KEY or add:KEY")
    ref = Dump(tensors)

    model, dtype = build_model(cfg)
    rtol, atol = TOLERANCE[dtype]
    checker = Checker(rtol, atol)
    # the initial state: every parameter and buffer PyTorch's model has (each under its first name;
    # tied and shared names are the same tensors) from ptool's dump, and nothing more
    state = {}
    for prefix, named in (("init.param.", model.named_parameters()), ("init.buffer.", model.named_buffers())):
        for n, _ in named:
            state[n] = ref.get(prefix + n)
    for key in ref.unread():
        if key.startswith(("init.param.", "init.buffer.")):
            ref.read.add(key)  # a second name of a tied or shared tensor: PyTorch must know it
            state[key.split(".", 2)[2]] = ref.tensors[key]
    missing = [n for n, t in state.items() if t is None]
    _, unexpected = model.load_state_dict({n: t for n, t in state.items() if t is not None}, strict=False)
    if unexpected:
        checker.one_sided.append(f"ptool dumped initial tensors PyTorch's model does not have: {unexpected}")
    if missing:
        checker.one_sided.append(f"PyTorch's model has initial tensors ptool's dump lacks: {missing}")

    params = list(model.parameters())
    opt = make_optimizer(cfg, params)
    # the shadow: torch's optimizer stepping copies of ptool's parameters with ptool's own gradients
    shadow = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    shadow_opt = make_optimizer(cfg, list(shadow.values())) if cfg.get("optimizer", {}).get("type") == "adamw" else None

    model.train()
    stopped_at = None
    for step in range(steps):
        s = f"step{step}."
        needs_target = cfg.get("loss", "sum") in ("mse", "cross_entropy")
        inp = ref.first(s + "input", "data.input")
        target = ref.first(s + "target", "data.target") if needs_target else None
        if inp is None or (needs_target and target is None):
            checker.one_sided.append(f"{s}input/target: missing from ptool's dump (neither {s}* nor data.*): steps from {step} not run")
            stopped_at = step  # what the steps not run left unread is no finding of its own
            break
        loss, out = train_step(model, cfg, opt, inp, target, step)
        checker.check(s + "loss", ref.get(s + "loss"), loss)
        checker.check(s + "output", ref.get(s + "output"), out)
        if train_step.grad_norm is not None:
            checker.check(s + "grad_norm", ref.get(s + "grad_norm"), train_step.grad_norm.to(torch.float64).reshape(()))
        grads = {name: ref.get(s + "grad." + name) for name, _ in model.named_parameters()}
        if shadow_opt and all(g is not None for g in grads.values()):
            for name, t in shadow.items():
                t.grad = grads[name].clone()
            shadow_opt.step()
        for name, p in model.named_parameters():
            checker.check(s + "grad." + name, grads[name], p.grad)
            value = ref.get(s + "param." + name)
            update_ok = (lambda n=name, v=value: checker.close(v, shadow[n])[0]) if shadow_opt and value is not None else None
            checker.check(s + "param." + name, value, p, update_ok)
        for name, b in model.named_buffers():
            checker.check(s + "buffer." + name, ref.get(s + "buffer." + name), b)
    for key in ref.unread():
        if stopped_at is not None and key.startswith("step") and int(key[4:key.index(".")]) >= stopped_at:
            continue
        checker.one_sided.append(f"{key}: dumped by ptool, compared with nothing (PyTorch's model has no such tensor)")

    name = os.path.basename(args.model)
    if checker.failed or checker.one_sided:
        print(f"{name}: {len(checker.one_sided)} keys on one side only, {len(checker.failed)} of {checker.count} tensors "
              f"differ from PyTorch {torch.__version__}:")
        for line in checker.one_sided + checker.failed:
            print("  " + line)
        return 1
    print(f"{name}: {checker.count} tensors agree with PyTorch {torch.__version__} over {steps} steps "
          f"(rtol {rtol}, atol {atol}; worst headroom {checker.worst:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
