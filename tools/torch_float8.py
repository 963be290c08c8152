"""torchao's Float8Linear (recipes tensorwise, rowwise and rowwise_with_gw_hp) in PyTorch 1.13, which has no float8 dtype: the
oracle of ptool's float8 linears (docs/float8.md) for tools/torch_golden.py.

The formats' rounding is written out: a float32 value x goes to e4m3fn (3 mantissa bits, normals
from 2^-6, subnormals in steps of 2^-9, largest 448) or e5m2 (2 bits, normals from 2^-14, steps of
2^-16, largest 57344) as torch's `.to(torch.float8_*)` does, round to nearest, ties to even, after
torchao's to_fp8_saturated clamp to +-max. A scale is torchao's amax_to_scale: max / max(amax,
1e-12) in float64, then float32; an operand is cast(x.float() * scale); a GEMM is the float32
product of the float8 values times (1/scale_a)(1/scale_b) (torch._scaled_mm's), in the output's dtype.
Recipe rowwise (torchao's ROWWISE): every operand e4m3fn, one scale per row or column along each
GEMM's reduction dim (amax_to_scale of that slice's amax, then round_scales_to_power_of_2:
exp2(floor(log2(scale))) in float32): forward x and W per row; grad input dy per row, W per column;
grad weight dy and x per column; the product times (1/scale_a[m]) (1/scale_b[n]).
Recipe rowwise_with_gw_hp (torchao's ROWWISE_WITH_GW_HP): the forward as rowwise; grad input dy per
row times W with one tensorwise scale rounded down to a power of 2 (torchao repeats it along the
columns; without fast accumulation it scales the product afterwards by (1/sa)(1/sb)); grad weight
dy^T x in the compute dtype, unscaled.

Which linears: torchtitan's module_filter_fn (in and out features multiples of 16, no filter_fqns
substring in the name), the routed experts left out, without filter_fqns the model's last linear
(its head). Data parallel ranks each scale their own rows (torchao under DDP and FSDP2), and
context parallel ranks their own positions (torchtitan's context_parallel shards the sequence in
place: the linears see plain local tensors, load-balanced cp rank r chunks r and 2cp-1-r of 2cp):
the one-device step here splits each microbatch's rows into the plan's ranks' and scales each
group apart, the weight's gradient the groups' products added in rank order (then added to the
gradient by autograd, where ptool adds each product to it: equal but for float32 rounding under
gradient accumulation; rowwise_with_gw_hp's is one matmul of every row, scaling nothing).
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


def cast_axis(x, dim):
    """(e4m3fn values in float32, scales) of x with one power-of-2 scale per slice reduced along dim."""
    scale = tensorwise_scale(x.detach().abs().amax(dim=dim, keepdim=True).float(), "e4m3fn")
    scale = torch.exp2(torch.floor(torch.log2(scale)))
    return round_float8(x.float() * scale, "e4m3fn"), scale


def rowwise_mm(a, sa, b, sb, dtype):
    """a [m, k] @ b [k, n] times 1/sa[m] and 1/sb[n] (sa [m, 1], sb [1, n]), as _scaled_mm's rowwise."""
    return (torch.matmul(a, b) * (1.0 / sa) * (1.0 / sb)).to(dtype)


class Tensorwise:
    @staticmethod
    def forward(x, w):
        x8, sx = cast(x, "e4m3fn")
        w8, sw = cast(w, "e4m3fn")
        return scaled_mm(x8, sx, w8.t(), sw, x.dtype)

    @staticmethod
    def grad_input(dy, w):
        d8, sd = cast(dy, "e5m2")
        w8, sw = cast(w, "e4m3fn")
        return scaled_mm(d8, sd, w8, sw, dy.dtype)

    @staticmethod
    def grad_weight(dy, x, dtype):
        d8, sd = cast(dy, "e5m2")
        x8, sx = cast(x, "e4m3fn")
        return scaled_mm(d8.t(), sd, x8, sx, dtype)


class Rowwise:
    @staticmethod
    def forward(x, w):
        x8, sx = cast_axis(x, 1)
        w8, sw = cast_axis(w, 1)
        return rowwise_mm(x8, sx, w8.t(), sw.t(), x.dtype)

    @staticmethod
    def grad_input(dy, w):
        d8, sd = cast_axis(dy, 1)
        w8, sw = cast_axis(w, 0)
        return rowwise_mm(d8, sd, w8, sw, dy.dtype)

    @staticmethod
    def grad_weight(dy, x, dtype):
        d8, sd = cast_axis(dy, 0)
        x8, sx = cast_axis(x, 0)
        return rowwise_mm(d8.t(), sd.t(), x8, sx, dtype)


class RowwiseWithGwHp:
    forward = Rowwise.forward
    grad_weight_hp = True  # _Float8Matmul: dy2^T x2 over every row, as autograd's mm

    @staticmethod
    def grad_input(dy, w):
        d8, sd = cast_axis(dy, 1)
        scale = tensorwise_scale(w.detach().abs().max().float(), "e4m3fn")
        scale = torch.exp2(torch.floor(torch.log2(scale)))
        w8 = round_float8(w.float() * scale, "e4m3fn")
        return rowwise_mm(d8, sd, w8, scale.expand(1, w.shape[1]), dy.dtype)


RECIPES = {"tensorwise": Tensorwise, "rowwise": Rowwise, "rowwise_with_gw_hp": RowwiseWithGwHp}


class RowGroups:
    """Each rank's rows of a [rows, features] activation of sequences of `seq` positions: the data
    ranks' equal blocks, each cut into the cp ranks' positions of every sequence."""

    def __init__(self, data, cp, balanced):
        self.data, self.cp, self.balanced = data, cp, balanced

    def indices(self, rows, seq):
        assert rows % self.data == 0, f"{rows} rows do not split into {self.data} data ranks"
        block, pieces = rows // self.data, 2 * self.cp if self.balanced else self.cp
        assert self.cp == 1 or (block % seq == 0 and seq % pieces == 0), f"{seq} positions over {self.cp} cp ranks"
        out = []
        for d in range(self.data):
            for r in range(self.cp):
                if self.cp == 1:
                    out.append(torch.arange(d * block, (d + 1) * block))
                    continue
                n = seq // pieces
                chunks = [r, 2 * self.cp - 1 - r] if self.balanced else [r]
                pos = torch.cat([torch.arange(c * n, (c + 1) * n) for c in chunks])
                out.append(torch.cat([first + pos for first in range(d * block, (d + 1) * block, seq)]))
        return out


class _Float8Matmul(torch.autograd.Function):
    """y2 = x2 w^T of a float8 linear, each rank's rows of x2 (index tensors) scaled apart."""

    @staticmethod
    def forward(ctx, x2, w, groups, recipe):
        ctx.save_for_backward(x2, w)
        ctx.groups, ctx.recipe = groups, recipe
        out = torch.empty(x2.shape[0], w.shape[0], dtype=x2.dtype)
        for idx in groups:
            out[idx] = recipe.forward(x2[idx], w)
        return out

    @staticmethod
    def backward(ctx, dy2):
        x2, w = ctx.saved_tensors
        dx, dw = torch.empty_like(x2), None
        hp = getattr(ctx.recipe, "grad_weight_hp", False)
        for idx in ctx.groups:
            dx[idx] = ctx.recipe.grad_input(dy2[idx], w)
            if hp:
                continue
            part = ctx.recipe.grad_weight(dy2[idx], x2[idx], w.dtype)
            dw = part if dw is None else dw + part
        if hp:
            dw = torch.matmul(dy2.t(), x2).to(w.dtype)
        return dx, dw, None, None


class Float8Forward:
    """A linear's forward through _Float8Matmul, the bias added after in the compute dtype."""

    def __init__(self, linear, groups, recipe):
        self.linear, self.groups, self.recipe = linear, groups, recipe

    def __call__(self, x):
        lin = self.linear
        seq = x.shape[1] if x.dim() == 3 else 1
        x2 = x.reshape(-1, x.shape[-1])
        y = _Float8Matmul.apply(x2, lin.weight, self.groups.indices(x2.shape[0], seq), self.recipe)
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
    if spec.get("recipe") not in RECIPES:
        raise SystemExit(f"float8 recipe {spec.get('recipe')!r}: the oracle has {', '.join(RECIPES)}")
    recipe = RECIPES[spec["recipe"]]
    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    experts = {id(m) for n, mod in model.named_modules() if hasattr(mod, "experts") for m in mod.experts.modules()}
    filters = spec.get("filter_fqns")
    head = None if filters is not None else (linears[-1][1] if linears else None)
    cp = plan.get("context_parallel")
    mesh = plan.get("mesh") or {}
    groups = RowGroups(data_ranks(plan), int(mesh.get(cp["mesh_dim"], 1)) if cp else 1,
                       bool(cp.get("load_balance", True)) if cp else False)
    out = []
    for name, m in linears:
        if m is head or id(m) in experts or any(f in name for f in (filters or [])):
            continue
        if m.in_features % 16 or m.out_features % 16:
            continue
        m.forward = Float8Forward(m, groups, recipe)
        out.append(name)
    return out
