"""torchao's Float8Linear (recipe tensorwise) in PyTorch 1.13, which has no float8 dtype: the
oracle of ptool's float8 linears (docs/float8.md) for tools/torch_golden.py.

The formats' rounding is written out: a float32 value x goes to e4m3fn (3 mantissa bits, normals
from 2^-6, subnormals in steps of 2^-9, largest 448) or e5m2 (2 bits, normals from 2^-14, steps of
2^-16, largest 57344) as torch's `.to(torch.float8_*)` does, round to nearest, ties to even, after
torchao's to_fp8_saturated clamp to +-max. A scale is torchao's amax_to_scale: max / max(amax,
1e-12) in float64, then float32; an operand is cast(x.float() * scale); a GEMM is the float32
product of the float8 values times (1/scale_a)(1/scale_b) (torch._scaled_mm's), in the output's dtype.

Which linears: torchtitan's module_filter_fn (in and out features multiples of 16, no filter_fqns
substring in the name), the routed experts left out, without filter_fqns the model's last linear
(its head). Data parallel ranks each scale their own rows (torchao under DDP and FSDP2): the
one-device step here splits each microbatch's rows into the plan's data ranks' and scales each
group apart, the weight's gradient the groups' products added in rank order (then added to the
gradient by autograd, where ptool adds each product to it: equal but for float32 rounding under
gradient accumulation).
"""
import torch
import torch.nn as nn

FORMATS = {  # mantissa bits, smallest normal exponent, largest value
    "e4m3fn": (3, -6, 448.0),
    "e5m2": (2, -14, 57344.0),
}


def round_float8(x, fmt):
    """x (float32) rounded to the format's values, saturated: exact in float32."""
    mbits, emin, vmax = FORMATS[fmt]
    x = x.float().clamp(-vmax, vmax)
    _, e = torch.frexp(x)  # x = m 2^e, 0.5 <= |m| < 1: the binade's step is 2^(e - 1 - mbits)
    step = torch.ldexp(torch.ones_like(x), (torch.clamp(e - 1, min=emin) - mbits).to(torch.int32))
    return torch.round(x / step) * step  # ties to even


def tensorwise_scale(amax, fmt):
    return (FORMATS[fmt][2] / amax.double().clamp(min=1e-12)).float()


def cast(x, fmt):
    """(float8 values in float32, scale) of x with its own amax."""
    scale = tensorwise_scale(x.detach().abs().max().float(), fmt)
    return round_float8(x.float() * scale, fmt), scale


def scaled_mm(a, sa, b, sb, dtype):
    alpha = (1.0 / sa) * (1.0 / sb)
    return (torch.matmul(a, b) * alpha).to(dtype)


class _Float8Matmul(torch.autograd.Function):
    """y2 = x2 w^T of a float8 linear, each of `groups` row blocks of x2 scaled apart."""

    @staticmethod
    def forward(ctx, x2, w, groups):
        assert x2.shape[0] % groups == 0, f"{x2.shape[0]} rows do not split into {groups} data ranks"
        ctx.save_for_backward(x2, w)
        ctx.groups = groups
        w8, sw = cast(w, "e4m3fn")
        outs = []
        for xg in x2.chunk(groups, 0):
            x8, sx = cast(xg, "e4m3fn")
            outs.append(scaled_mm(x8, sx, w8.t(), sw, x2.dtype))
        return torch.cat(outs, 0)

    @staticmethod
    def backward(ctx, dy2):
        x2, w = ctx.saved_tensors
        w8, sw = cast(w, "e4m3fn")
        dxs, dw = [], None
        for xg, dg in zip(x2.chunk(ctx.groups, 0), dy2.chunk(ctx.groups, 0)):
            d8, sd = cast(dg, "e5m2")
            x8, sx = cast(xg, "e4m3fn")
            dxs.append(scaled_mm(d8, sd, w8, sw, dy2.dtype))
            part = scaled_mm(d8.t(), sd, x8, sx, w.dtype)
            dw = part if dw is None else dw + part
        return torch.cat(dxs, 0), dw, None


class Float8Forward:
    """A linear's forward through _Float8Matmul, the bias added after in the compute dtype."""

    def __init__(self, linear, groups):
        self.linear, self.groups = linear, groups

    def __call__(self, x):
        lin = self.linear
        y = _Float8Matmul.apply(x.reshape(-1, x.shape[-1]), lin.weight, self.groups)
        y = y.reshape(*x.shape[:-1], lin.weight.shape[0])
        return y + lin.bias if lin.bias is not None else y


def data_ranks(plan):
    """The plan's data ranks (the data_parallel section's dims, multiplied)."""
    dp = plan.get("data_parallel")
    if not dp:
        return 1
    mesh = plan.get("mesh") or {}
    dims = dp.get("mesh_dim") or (next(iter(mesh)) if len(mesh) == 1 else None)
    out = 1
    for d in dims if isinstance(dims, list) else [dims]:
        out *= int(mesh.get(d, 1))
    return out


def convert(model, plan):
    """Swaps the plan's float8 linears' forwards; returns their names in module order."""
    spec = plan.get("float8")
    if not spec:
        return []
    if spec.get("recipe") != "tensorwise":
        raise SystemExit(f"float8 recipe {spec.get('recipe')!r}: the oracle has tensorwise only")
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    experts = {id(m) for n, mod in model.named_modules() if hasattr(mod, "experts") for m in mod.experts.modules()}
    filters = spec.get("filter_fqns")
    head = None if filters is not None else (linears[-1][1] if linears else None)
    groups, out = data_ranks(plan), []
    for name, m in linears:
        if m is head or id(m) in experts or any(f in name for f in (filters or [])):
            continue
        if m.in_features % 16 or m.out_features % 16:
            continue
        m.forward = Float8Forward(m, groups)
        out.append(name)
    return out
