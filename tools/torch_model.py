"""Build a ptool model YAML as a PyTorch module, and read/write safetensors without the
`safetensors` package (Debian has no python3-safetensors). Used by tests/torch_crosscheck.py
and tools/torch_golden.py.
"""
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

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


class Group:
    """An unnamed (transparent) residual or sequential: its modules register on the container
    around it, as code in that container's forward() (HF's decoder layers)."""

    def __init__(self, residual, children):
        self.residual, self.children = residual, children


class Seq(nn.Module):
    """A container whose children run in order (nn.Sequential with explicit names)."""

    def __init__(self, children):
        super().__init__()
        self.order = self._register(children)

    def _register(self, children):
        steps = []
        for name, mod in children:
            if isinstance(mod, Group):
                steps.append((mod.residual, self._register(mod.children)))
            else:
                self.add_module(name, mod)
                steps.append(name)
        return steps

    def _run(self, steps, x):
        for step in steps:
            if isinstance(step, str):
                x = getattr(self, step)(x)
            else:
                residual, inner = step
                y = self._run(inner, x)
                x = x + y if residual else y
        return x

    def forward(self, x):
        return self._run(self.order, x)


class Residual(Seq):
    def forward(self, x):
        return x + super().forward(x)


class PositionEmbedding(nn.Module):
    """GPT-2's wpe added to its input: x + weight[:T] (HF: inputs_embeds + wpe(position_ids))."""

    def __init__(self, positions, dim):
        super().__init__()
        # nn.Embedding's own init, N(0, 1) (torch.empty left whatever the allocator held: a golden
        # recorded from it started from values of 1e32 and its losses were NaN)
        self.weight = nn.Parameter(torch.empty(positions, dim).normal_())

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


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


def rotate_half(x):
    """Hugging Face Llama's rotate_half."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def scaled_inv_freq(inv_freq, scaling):
    """transformers' rope_scaling: linear (every frequency / factor) and llama3
    (_compute_llama3_parameters), in float32 as there."""
    if not scaling:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["type"] == "linear":
        return inv_freq / factor
    low, high = float(scaling.get("low_freq_factor", 1)), float(scaling.get("high_freq_factor", 4))
    old = float(scaling.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / inv_freq
    llama = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, llama)


def rope_tables(theta, hd, t, dtype, scaling=None):
    """Hugging Face LlamaRotaryEmbedding's cos and sin for positions 0..t-1 (computed in float32)."""
    inv_freq = scaled_inv_freq(1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd)), scaling)
    freqs = torch.outer(torch.arange(t).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    """HF's Llama/Qwen attention; head_dim (Qwen3: q_proj is dim -> heads x head_dim) and qk_norm
    (Qwen3's q_norm/k_norm: RMSNorm of each head of q and k, before RoPE; "full": OLMo2's, over all
    of q's and k's features before the heads are split)."""

    def __init__(self, dim, heads, kv_heads, causal, qkv_bias, o_bias, rope_theta=None, rope_scaling=None,
                 head_dim=None, qk_norm=False, qk_norm_eps=1e-6):
        super().__init__()
        self.heads, self.kv_heads, self.causal, self.hd = heads, kv_heads, causal, head_dim or dim // heads
        self.rope_theta, self.rope_scaling = rope_theta, rope_scaling
        self.q_proj = nn.Linear(dim, heads * self.hd, bias=qkv_bias)
        self.k_proj = nn.Linear(dim, self.hd * kv_heads, bias=qkv_bias)
        self.v_proj = nn.Linear(dim, self.hd * kv_heads, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * self.hd, dim, bias=o_bias)
        self.qk_full = qk_norm == "full"
        if self.qk_full:
            self.q_norm = RMSNorm(heads * self.hd, qk_norm_eps, True)
            self.k_norm = RMSNorm(kv_heads * self.hd, qk_norm_eps, True)
        elif qk_norm:
            self.q_norm, self.k_norm = RMSNorm(self.hd, qk_norm_eps, True), RMSNorm(self.hd, qk_norm_eps, True)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x):
        b, t, c = x.shape
        q, k = self.q_proj(x), self.k_proj(x)
        if self.qk_full:  # OLMo2: over the whole projection
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.view(b, t, self.heads, self.hd), k.view(b, t, self.kv_heads, self.hd)
        if self.q_norm is not None and not self.qk_full:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        if self.rope_theta is not None:  # HF apply_rotary_pos_emb, before repeat_kv
            cos, sin = rope_tables(self.rope_theta, self.hd, t, q.dtype, self.rope_scaling)
            q = (q * cos) + (rotate_half(q) * sin)
            k = (k * cos) + (rotate_half(k) * sin)
        group = self.heads // self.kv_heads
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            s = s.masked_fill(~mask, float("-inf"))
        o = s.softmax(-1) @ v
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.heads * self.hd))


class GatedMlp(nn.Module):
    def __init__(self, dim, hidden, act, bias):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=bias)
        self.up_proj = nn.Linear(dim, hidden, bias=bias)
        self.down_proj = nn.Linear(hidden, dim, bias=bias)
        self.act = act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Moe(nn.Module):
    """transformers' sparse MoE blocks as their modeling files compute them (Mixtral, Qwen2-MoE,
    Qwen3-MoE; DeepSeek-V3's sigmoid router): router logits, scores in float32 (softmax, or
    sigmoid), the top_k of score + e_score_correction_bias, their scores renormalised
    (norm_topk_prob) and times routed_scaling_factor, cast to the hidden dtype; each expert on the
    rows routed to it, index_add_ in expert order; + sigmoid(shared_expert_gate(x)) * shared_expert(x).
    The selection bias is drawn (randn * 0.1) where transformers starts it at zeros, so that a golden
    from here exercises selection by score + bias (ptool replays a golden's buffers)."""

    def __init__(self, spec):
        super().__init__()
        dim, e = spec["dim"], spec["experts"]
        self.k, self.softmax = spec["top_k"], spec.get("score_func", "softmax") == "softmax"
        self.norm, self.scaling = spec.get("norm_topk_prob", True), float(spec.get("routed_scaling_factor", 1.0))
        self.gate = nn.Linear(dim, e, bias=False)
        self.experts = nn.ModuleList([GatedMlp(dim, spec["hidden"], nn.SiLU(), False) for _ in range(e)])
        self.shared_expert = GatedMlp(dim, spec["shared_hidden"], nn.SiLU(), False) if spec.get("shared_hidden") else None
        self.shared_expert_gate = nn.Linear(dim, 1, bias=False) if spec.get("shared_gate") else None
        if spec.get("selection_bias"):
            self.register_buffer("e_score_correction_bias", torch.randn(e) * 0.1)
        else:
            self.e_score_correction_bias = None
        # Switch Transformer's load-balancing loss per layer, as Megatron's
        # switch_load_balancing_loss_func: coef E sum_e f_e P_e, f_e the share of the T k slots routed
        # to e (no gradient), P_e the mean softmax score; train_step adds it to the microbatch's loss
        self.aux_coef = float(spec.get("aux_loss_coef", 0.0))
        self.aux_loss = None
        # capacity-factor routing (Megatron's position drop policy, over the microbatch): each expert
        # keeps the first ceil(capacity_factor T k / E) of its slots in token order; the rest weigh 0
        self.capacity = float(spec.get("capacity_factor", 0.0))

    def forward(self, x):
        h = x.reshape(-1, x.shape[-1])
        logits = self.gate(h)
        scores = F.softmax(logits, dim=1, dtype=torch.float) if self.softmax else logits.float().sigmoid()
        choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias.float()
        idx = torch.topk(choice, self.k, dim=-1).indices
        w = scores.gather(1, idx)
        if self.aux_coef > 0:
            e = len(self.experts)
            f = F.one_hot(idx, num_classes=e).sum(dim=(0, 1)).float() / (idx.shape[0] * self.k)
            self.aux_loss = self.aux_coef * e * (f * scores.mean(dim=0)).sum()
        if self.norm:
            w = w / w.sum(dim=-1, keepdim=True)
        w = w * self.scaling
        if self.capacity > 0:
            e = len(self.experts)
            cap = math.ceil(self.capacity * idx.shape[0] * self.k / e)
            onehot = F.one_hot(idx, num_classes=e).reshape(-1, e)  # slots in token order
            position = (onehot.cumsum(0) - 1).gather(1, idx.reshape(-1, 1)).reshape(idx.shape)
            w = w * (position < cap).to(w.dtype)
        w = w.to(h.dtype)
        out = torch.zeros_like(h)
        mask = F.one_hot(idx, num_classes=len(self.experts)).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            slot, tok = torch.where(mask[e])
            out.index_add_(0, tok, expert(h[tok]) * w[tok, slot, None])
        if self.shared_expert is not None:
            s = self.shared_expert(h)
            if self.shared_expert_gate is not None:
                s = torch.sigmoid(self.shared_expert_gate(h)) * s
            out = out + s
        return out.reshape(x.shape)


ACTS = {"silu": nn.SiLU(), "relu": nn.ReLU(), "gelu": nn.GELU(), "tanh": nn.Tanh()}
FINFO_EPS = {torch.float32: torch.finfo(torch.float32).eps, torch.float64: torch.finfo(torch.float64).eps,
             torch.bfloat16: torch.finfo(torch.bfloat16).eps, torch.float16: torch.finfo(torch.float16).eps}


def build(spec, prefix, registry, dtype):
    t = spec["type"]
    if "name" not in spec and t in ("sequential", "residual"):  # transparent: its modules keep the prefix
        return Group(t == "residual", [(c.get("name"), build(c, prefix, registry, dtype)) for c in spec["modules"]])
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
        m = CounterDropout(float(spec.get("p", 0.5)), fqn)
    elif t == "attention":
        bias = spec.get("bias", True)
        m = Attention(spec["dim"], spec["heads"], spec.get("kv_heads", spec["heads"]), spec.get("causal", False),
                      spec.get("qkv_bias", bias), spec.get("o_bias", bias),
                      float(spec["rope_theta"]) if "rope_theta" in spec else None, spec.get("rope_scaling"),
                      spec.get("head_dim"), spec.get("qk_norm", False), float(spec.get("qk_norm_eps", 1e-6)))
    elif t == "position_embedding":
        m = PositionEmbedding(spec["positions"], spec["dim"])
    elif t == "gated_mlp":
        m = GatedMlp(spec["dim"], spec["hidden"], ACTS[spec.get("activation", "silu")], spec.get("bias", False))
    elif t == "moe":
        m = Moe(spec)
    elif t in ("sequential", "residual"):
        cls = Residual if t == "residual" else Seq
        m = cls([(c.get("name"), build(c, fqn, registry, dtype)) for c in spec["modules"]])
    elif t == "repeat":
        copies = []
        for i in range(spec["count"]):
            cf = f"{fqn}.{i}"
            copy = Seq([(c.get("name"), build(c, cf, registry, dtype)) for c in spec["modules"]])
            registry[cf] = copy
            copies.append((str(i), copy))
        m = Seq(copies)
    elif t == "shared":
        return registry[spec["module"]]
    else:
        raise SystemExit(f"cross-check: unknown module type {t}")
    registry[fqn] = m
    return m


def train_step(model, cfg, opt, inp, target, step=0, compute=None):
    """One optimizer step as ptool's: gradient_accumulation microbatches of rows (each loss divided by
    their count), clip_grad_norm, the optimizer. Returns (the losses summed, the outputs concatenated).

    compute: mixed precision (a copy of the model in param_dtype, as FSDP2's MixedPrecisionPolicy
    computes): each step casts the masters into it, runs forward and backward there (the input cast,
    the loss on the output cast back to the masters' dtype, as torchtitan), and casts its gradients
    into the masters' .grad; clipping and the optimizer step the masters."""
    n = int(cfg.get("gradient_accumulation", 1))
    rows = inp.shape[0] // n
    if opt:
        opt.zero_grad(set_to_none=False)
    run = model
    if compute is not None:
        run = compute
        with torch.no_grad():
            for pc, pm in zip(compute.parameters(), model.parameters()):
                pc.copy_(pm)
                pc.grad = None
    dtype = next(model.parameters()).dtype if list(model.parameters()) else torch.float32
    CounterDropout.ctx.update(seed=int(cfg.get("seed", 0)), step=step)
    outs, total = [], None
    kind, ignore = cfg.get("loss", "sum"), int(cfg.get("ignore_index", -100))
    # loss_normalization global_tokens (torchtitan's global_valid_tokens): each microbatch's sum over its
    # valid targets divided by the step's count, no division by n; mean_per_call: each its mean, / n
    items = None
    if cfg.get("loss_normalization") == "global_tokens":
        items = float((target != ignore).sum()) if kind == "cross_entropy" else float(
            target.numel() if kind == "mse" else 0)
    for j in range(n):
        mb_target = target[j * rows:(j + 1) * rows] if target is not None else None
        x = inp[j * rows:(j + 1) * rows]
        if compute is not None and x.is_floating_point():
            x = x.to(next(compute.parameters()).dtype)
        CounterDropout.ctx["row"] = j * rows
        out = run(x)
        if compute is not None:
            out = out.to(dtype)
        if items is None:
            loss = compute_loss(kind, out, mb_target, ignore)
        else:
            loss = compute_loss(kind, out, mb_target, ignore, reduction="sum") / (
                items if kind != "mean" else float(out.numel() * n))
        aux = None
        for m in run.modules():  # the mixtures of experts' balancing losses
            if isinstance(m, Moe) and m.aux_loss is not None:
                aux = m.aux_loss.to(loss.dtype) if aux is None else aux + m.aux_loss.to(loss.dtype)
                m.aux_loss = None
        if items is None:
            loss = loss + aux if aux is not None else loss
            if n > 1:
                loss = loss / n
        elif aux is not None:  # a balancing loss stays a mean over the microbatches
            loss = loss + (aux / n if n > 1 else aux)
        if loss.requires_grad:
            loss.backward()
        outs.append(out.detach())
        total = loss.detach() if total is None else total + loss.detach()
    if compute is not None:
        for pc, pm in zip(compute.parameters(), model.parameters()):
            pm.grad = pc.grad.to(pm.dtype) if pc.grad is not None else torch.zeros_like(pm)
    norm = None
    if cfg.get("clip_grad_norm"):
        norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), float(cfg["clip_grad_norm"]))
    if opt:
        opt.step()
    train_step.grad_norm = norm  # clip_grad_norm_'s return (ptool's step{k}.grad_norm), or None
    return total, torch.cat(outs)


# ptool's counter-based RNG (core/rng.h: Philox4x32-10, FNV-1a stream ids), for dropout masks
_M32 = 0xFFFFFFFF


def stream_id(a, b=b"", c=0):
    h = 1469598103934665603
    for byte in a + b"\xff" + b + b"\xfe" + c.to_bytes(8, "little"):
        h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def philox4x32(key, hi, lo):
    c0, c1, c2, c3 = lo & _M32, (lo >> 32) & _M32, hi & _M32, (hi >> 32) & _M32
    k0, k1 = key & _M32, (key >> 32) & _M32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c2, c1, c3 = ((p1 >> 32) ^ c1 ^ k0) & _M32, ((p0 >> 32) ^ c3 ^ k1) & _M32, p1 & _M32, p0 & _M32
        k0, k1 = (k0 + 0x9E3779B9) & _M32, (k1 + 0xBB67AE85) & _M32
    return c0, c1, c2, c3


def counter_uniform(seed, stream, index):
    r = philox4x32(seed, stream, index >> 1)
    hi, lo = (r[2], r[3]) if index & 1 else (r[0], r[1])
    return (((hi << 21) ^ (lo >> 11)) & ((1 << 53) - 1)) / 9007199254740992.0


class CounterDropout(nn.Module):
    """ptool's dropout: element i of the whole activation (rows counted from the step's batch) is
    dropped when U(seed, stream_id("dropout", fqn, step), i) < p; kept ones scaled by 1/(1-p)."""
    ctx = {"seed": 0, "step": 0, "row": 0}

    def __init__(self, p, fqn):
        super().__init__()
        self.p, self.fqn = p, fqn

    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        c = CounterDropout.ctx
        stream = stream_id(b"dropout", self.fqn.encode(), c["step"])
        per_row = x[0].numel() if x.dim() else 1
        base = c["row"] * per_row
        keep = 1.0 / (1.0 - self.p)
        m = [0.0 if counter_uniform(c["seed"], stream, base + i) < self.p else keep for i in range(x.numel())]
        return x * torch.tensor(m, dtype=torch.float64).reshape(x.shape).to(x.dtype)


def compute_loss(kind, out, target, ignore_index=-100, reduction="mean"):
    if kind == "sum":
        return out.sum()
    if kind == "mean":
        return out.mean() if reduction == "mean" else out.sum()
    if kind == "mse":
        return F.mse_loss(out, target, reduction=reduction)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction)


def apply_target_mask(target, spec, ignore_index, seed):
    """ptool's batch.masked_targets (model/target_mask.h): row r's prompt length from U(2r), its
    padding from U(2r + 1), element i dropped when U(2 rows + i) < fraction, on the counter-based
    stream (seed, "data", "target_mask")."""
    stream = stream_id(b"data", b"target_mask")
    rows = target.shape[0]
    per_row = target.numel() // rows
    seq = target.shape[1] if target.dim() >= 2 else 1
    inner = per_row // seq

    def length(index, lohi):
        lo, hi = (lohi, lohi) if isinstance(lohi, int) else lohi
        return lo + int(counter_uniform(seed, stream, index) * (hi - lo + 1))

    flat = target.reshape(-1).clone()
    frac = float(spec.get("fraction", 0))
    for r in range(rows):
        prompt = length(2 * r, spec.get("prompt", 0))
        padding = length(2 * r + 1, spec.get("padding", 0))
        for t in range(seq):
            edge = t < prompt or t >= seq - padding
            for j in range(inner):
                i = r * per_row + t * inner + j
                if edge or (frac > 0 and counter_uniform(seed, stream, 2 * rows + i) < frac):
                    flat[i] = ignore_index
    return flat.reshape(target.shape)




ST_NAMES = {v: k for k, v in DTYPES.items()}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, tensor); metadata: dict of str -> str."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors:
        data = t.detach().contiguous().cpu().numpy().tobytes() if t.dtype != torch.bfloat16 else \
            t.detach().contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": ST_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def build_model(cfg):
    """The root container of a model YAML (already parsed), as PyTorch modules."""
    dtype = MODEL_DTYPES[cfg.get("dtype", "float32")]
    registry = {}
    return Seq([(c["name"], build(c, "", registry, dtype)) for c in cfg["modules"]]).to(dtype), dtype


def make_optimizer(cfg, params):
    # PyYAML follows YAML 1.1, where 1e-6 (no dot) is a string; ptool reads it as a number
    o = {k: (float(v) if k in ("lr", "momentum", "weight_decay", "eps") else v)
         for k, v in cfg.get("optimizer", {"type": "sgd"}).items()}
    if not params:  # a parameter-free model (identity): torch.optim refuses an empty list
        return None
    if o["type"] == "sgd":
        return torch.optim.SGD(params, lr=o.get("lr", 1e-3), momentum=o.get("momentum", 0.0),
                               weight_decay=o.get("weight_decay", 0.0), foreach=False)
    return torch.optim.AdamW(params, lr=o.get("lr", 1e-3), betas=tuple(float(b) for b in o.get("betas", (0.9, 0.999))),
                             eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 1e-2), foreach=False)


def ptool_hash(text):
    """ptool's text_hash: FNV-1a 64 over the text, separators as core/rng.cpp's stream_id."""
    return f"{stream_id(text.encode()):016x}"
