#!/usr/bin/env python3
"""Record a ptool golden file from PyTorch itself.

    /usr/bin/python3 tools/torch_golden.py models/mlp.yaml plans/mlp_root_module.yaml -o torch_mlp.safetensors
    ptool verify models/mlp.yaml plans/mlp_root_module.yaml --golden torch_mlp.safetensors

Builds the model YAML in PyTorch with PyTorch's own default init (torch.manual_seed(seed)) and
data (torch.randn, torch.randint), trains the model's steps with torch.optim (dropout masks from
ptool's counter-based RNG, the plan's mixed precision as FSDP2 runs it), and writes what
ptool's golden format holds: init.param.*, init.buffer.*, data.*, step{k}.loss/output/grad.*/
param.*/buffer.*, and the metadata (model and plan text with ptool's hashes, dtype, tolerance).
ptool replays a golden from its recorded init and data, so the file checks ptool's reference and
parallel runs against PyTorch's numbers. The plan's layout is not run here: DDP, FSDP and HSDP
(FSDP's ShardingStrategy.HYBRID_SHARD, fully_shard on a 2-D mesh) all average each gradient over the
whole data group, which for the mean loss is this one-device step's gradient of the global batch.
The step accumulates gradient_accumulation G rounds: the plan's key where it has one (it overrides
the model's, docs/plan_format.md), else the model's. A plan with pipeline_parallel is its reference:
G rounds of the plan's microbatches per round, G x microbatches microbatches of consecutive rows,
each microbatch's loss divided by that count, one optimizer step (Debian's torch 1.13 has no
torch.distributed.pipelining; its tests hold a pipeline to this same loop). A plan's float8 section
swaps the linears it selects for torchao's Float8Linear, tensorwise, written out in
tools/torch_float8.py (torch 1.13 has no float8 dtype), each data rank's rows scaled apart. Needs
Debian's python3-torch and python3-yaml only.
"""
import argparse
import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import yaml  # noqa: E402
from torch_float8 import convert as convert_float8  # noqa: E402
from torch_model import (MODEL_DTYPES, apply_target_mask, build_model, make_optimizer, ptool_hash,  # noqa: E402
                         train_step, write_safetensors)


def batch_tensor(spec, dtype, classes=None):
    if spec is None:
        return None
    if isinstance(spec, dict):  # {tokens: shape, vocab: n}
        return torch.randint(0, spec["vocab"], spec["tokens"])
    if classes is not None:
        return torch.randint(0, classes, spec)
    return torch.randn(spec, dtype=dtype)


def pipeline_microbatches(plan):
    """The microbatches a step of the plan's pipeline runs per round (plan.h microbatches_per_round):
    pipeline_parallel.microbatches, else one per stage (pp ranks x virtual stages); 1 without one."""
    pp = plan.get("pipeline_parallel")
    if pp is None:
        return 1
    if pp.get("microbatches"):
        return int(pp["microbatches"])
    mesh = plan.get("mesh") or {}
    dim = pp.get("mesh_dim") or (next(iter(mesh)) if len(mesh) == 1 else None)
    if dim not in mesh:
        raise SystemExit(f"pipeline_parallel: no mesh dim {dim!r} in {mesh}")
    interleaved = str(pp.get("schedule", "1f1b")).lower() in ("interleaved_1f1b", "interleaved1f1b")
    return int(mesh[dim]) * int(pp.get("virtual_stages", 2 if interleaved else 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("plan")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--steps", type=int, default=0)
    args = ap.parse_args()
    model_text, plan_text = open(args.model).read(), open(args.plan).read()
    cfg = yaml.safe_load(model_text)
    plan = yaml.safe_load(plan_text) or {}
    # a pipeline's reference: G rounds of its microbatches, G x microbatches accumulated (train_step);
    # G is the plan's gradient_accumulation where it says one (it overrides the model's), else the model's
    rounds = int(plan.get("gradient_accumulation") or cfg.get("gradient_accumulation", 1))
    if plan.get("loss_normalization"):  # the plan's overrides the model's, as gradient_accumulation
        cfg["loss_normalization"] = plan["loss_normalization"]
    cfg["gradient_accumulation"] = rounds * pipeline_microbatches(plan)
    torch.manual_seed(cfg.get("seed", 0))
    model, dtype = build_model(cfg)
    steps = args.steps or (plan.get("verify") or {}).get("steps") or cfg.get("steps", 1)
    loss_kind = cfg.get("loss", "sum")
    inp = batch_tensor(cfg["batch"]["input"], dtype)
    with torch.no_grad():
        out_shape = model(inp).shape
    torch.manual_seed(cfg.get("seed", 0))  # the probe above changed nothing but BatchNorm's running stats
    model, dtype = build_model(cfg)
    convert_float8(model, plan)  # the plan's float8 linears (tools/torch_float8.py)
    target_spec = cfg["batch"].get("target")
    if loss_kind == "cross_entropy":
        target = batch_tensor(target_spec or list(out_shape[:-1]), dtype, classes=out_shape[-1])
        if cfg["batch"].get("masked_targets"):  # ptool's mask, drawn as ptool draws it
            target = apply_target_mask(target, cfg["batch"]["masked_targets"], int(cfg.get("ignore_index", -100)),
                                       int(cfg.get("seed", 0)))
    elif loss_kind == "mse":
        target = batch_tensor(target_spec or list(out_shape), dtype)
    else:
        target = None

    tensors = [("init.param." + n, p.detach().clone()) for n, p in model.named_parameters()]
    tensors += [("init.buffer." + n, b.detach().clone()) for n, b in model.named_buffers()]
    tensors.append(("data.input", inp))
    if target is not None:
        tensors.append(("data.target", target))
    opt = make_optimizer(cfg, list(model.parameters()))
    # the plan's mixed precision (FSDP2's MixedPrecisionPolicy): a param_dtype copy computes, the
    # model's parameters are the float masters the optimizer steps
    mp = (plan.get("data_parallel") or {}).get("mixed_precision")
    compute = copy.deepcopy(model).to(MODEL_DTYPES[mp["param_dtype"]]) if mp else None
    model.train()
    for step in range(steps):
        loss, out = train_step(model, cfg, opt, inp, target, step, compute)
        s = f"step{step}."
        tensors += [(s + "loss", loss.detach().clone()), (s + "output", out.detach().clone())]
        if train_step.grad_norm is not None:
            tensors.append((s + "grad_norm", train_step.grad_norm.detach().to(torch.float64).reshape(())))
        tensors += [(s + "grad." + n, p.grad.detach().clone()) for n, p in model.named_parameters()]
        tensors += [(s + "param." + n, p.detach().clone()) for n, p in model.named_parameters()]
        tensors += [(s + "buffer." + n, b.detach().clone()) for n, b in model.named_buffers()]
    metadata = {
        "model_yaml": model_text, "plan_yaml": plan_text, "model_hash": ptool_hash(model_text),
        "plan_hash": ptool_hash(plan_text), "model_path": args.model, "plan_path": args.plan,
        "dtype": cfg.get("dtype", "float32"), "device": "cpu", "steps": str(steps),
        "ptool_version": "none", "producer": f"PyTorch {torch.__version__}",
    }  # no rtol/atol: ptool judges by its default for the model and plan (torch.testing's per dtype)
    write_safetensors(args.output, tensors, metadata)
    print(f"wrote {args.output}: {len(tensors)} tensors, {steps} steps of {args.model} from PyTorch {torch.__version__}")


if __name__ == "__main__":
    main()
