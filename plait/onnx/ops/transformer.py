"""Transformer building blocks: RotaryEmbedding and SwiGLU, as elementwise plait ops (plus a row gather of the
cos/sin caches when position ids are given)."""

from __future__ import annotations

from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, cat, stack
from plait.graph.ops import indexing
from plait.onnx.importer import Ctx
from plait.onnx.ops import register


def _swiglu(ctx: Ctx, ins: list[Any]) -> Tensor:
    a, b = ctx.t(ins[0]), ctx.t(ins[1])
    if a.shape != b.shape:
        raise ctx.error(f"A {a.shape} and B {b.shape} must have one shape (SwiGLU does not broadcast)")
    alpha = float(ctx.attr("alpha", 1.0))
    gate = (a.astype(dtypes.float32) * alpha).sigmoid().astype(a.dtype)
    return a * gate * b


register("SwiGLU", _swiglu)


def _cache_at(ctx: Ctx, cache: Tensor, pos: Tensor) -> Tensor:
    """cache[pos] for a (max_positions, d) cache and (batch, seq) position ids: (batch, seq, d)."""
    rows = Tensor(indexing.gather_rows(cache.node, pos.reshape(-1).astype(dtypes.int64).node))
    return rows.reshape(*pos.shape, cache.shape[-1])


def _rotary(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, cos, sin = ctx.t(ins[0]), ctx.t(ins[1]), ctx.t(ins[2])
    shape = x.shape
    if x.ndim == 4:  # (batch, heads, seq, head_size) -> (batch, seq, heads, head_size)
        x = x.permute(0, 2, 1, 3)
    elif x.ndim == 3:
        heads = int(ctx.attr("num_heads", 0))
        if heads <= 0 or shape[2] % heads:
            raise ctx.error(f"a 3-D input {shape} needs a num_heads attribute that divides {shape[2]}")
        x = x.reshape(shape[0], shape[1], heads, shape[2] // heads)
    else:
        raise ctx.error(f"input {shape} must be 3-D (batch, seq, hidden) or 4-D (batch, heads, seq, head_size)")
    head = x.shape[3]
    rot = int(ctx.attr("rotary_embedding_dim", 0)) or head
    half = rot // 2
    if len(ins) > 3 and ins[3] is not None:
        cos, sin = _cache_at(ctx, cos, ctx.t(ins[3])), _cache_at(ctx, sin, ctx.t(ins[3]))
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ctx.error(f"cos/sin caches end in {cos.shape[-1]}/{sin.shape[-1]}, need rotary_embedding_dim/2 = {half}")
    cos, sin = cos.unsqueeze(2).astype(x.dtype), sin.unsqueeze(2).astype(x.dtype)  # (batch, seq, 1, half)
    part = x[..., :rot]
    interleaved = bool(ctx.attr("interleaved", 0))
    x1, x2 = (part[..., 0::2], part[..., 1::2]) if interleaved else (part[..., :half], part[..., half:])
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    turned = stack([real, imag], -1).reshape(*real.shape[:-1], rot) if interleaved else cat([real, imag], -1)
    out = cat([turned, x[..., rot:]], -1) if rot < head else turned
    return out.reshape(*shape) if len(shape) == 3 else out.permute(0, 2, 1, 3)


register("RotaryEmbedding", _rotary)


def _causal_conv_with_state(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    """A depthwise causal 1-D convolution that carries its last k-1 inputs between calls (state-space and
    linear-attention blocks): k shifted products of the state-prefixed input, then an optional SiLU."""
    x, w = ctx.t(ins[0]), ctx.t(ins[1])
    if x.ndim != 3 or w.ndim != 3 or w.shape[:2] != (x.shape[1], 1):
        raise ctx.error(f"input {x.shape} must be (batch, channels, length) and weight {w.shape} (channels, 1, k)")
    b, c, length = x.shape
    k = w.shape[2]
    act = ctx.attr("activation", "none")
    if act not in ("none", "silu", "swish"):
        raise ctx.unsupported(f"activation {act!r} (supported: none, silu, swish)")
    past = ins[3] if len(ins) > 3 and ins[3] is not None else None
    if past is not None and tuple(past.shape) != (b, c, k - 1):
        raise ctx.error(f"past_state {tuple(past.shape)} must be (batch, channels, k - 1) = {(b, c, k - 1)}")
    state = (
        ctx.t(past).astype(x.dtype) if past is not None else Tensor.zeros(b, c, k - 1, dtype=x.dtype, device=x.device)
    )
    padded = cat([state, x], -1) if k > 1 else x
    wf = w.astype(dtypes.float32).reshape(c, k)
    out = padded[..., 0:length].astype(dtypes.float32) * wf[:, 0:1]
    for j in range(1, k):
        out = out + padded[..., j : j + length].astype(dtypes.float32) * wf[:, j : j + 1]
    if len(ins) > 2 and ins[2] is not None:
        out = out + ctx.t(ins[2]).astype(dtypes.float32).reshape(c, 1)
    out = out.astype(x.dtype)
    if act != "none":
        out = (out.astype(dtypes.float32) * out.astype(dtypes.float32).sigmoid()).astype(x.dtype)
    present = (
        padded[..., padded.shape[-1] - (k - 1) :] if k > 1 else Tensor.zeros(b, c, 0, dtype=x.dtype, device=x.device)
    )
    return [out, present]


register("CausalConvWithState", _causal_conv_with_state)


def _heads(x: Tensor, heads: int, what: str, ctx: Ctx) -> Tensor:
    """(B, T, H*D) -> (B, H, T, D) in float32."""
    b, t, hd = x.shape
    if hd % heads:
        raise ctx.error(f"{what} {x.shape}: last axis {hd} is not a multiple of {heads} heads")
    return x.reshape(b, t, heads, hd // heads).permute(0, 2, 1, 3).astype(dtypes.float32)


def _linear_attention(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    """Recurrent linear attention (linear, gated, delta and gated-delta state updates) with grouped KV heads. The
    recurrence is unrolled over the (static) sequence length: a handful of small ops per step, which suits decode
    steps and short prefills; a long prefill builds a long graph (docs/onnx.md, Limits)."""
    q, k, v = (ctx.t(ins[i]) for i in range(3))
    opt = [ins[i] if len(ins) > i else None for i in range(3, 6)]
    past, decay, beta = opt
    rule = ctx.attr("update_rule", "gated_delta")
    hq, hkv = int(ctx.attr("q_num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ctx.unsupported(f"update_rule {rule!r} (supported: linear, gated, delta, gated_delta)")
    if hq <= 0 or hkv <= 0 or hq % hkv or q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ctx.error(f"q_num_heads {hq} must be a multiple of kv_num_heads {hkv}, with 3-D q, k, v")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise ctx.error(f"update_rule {rule!r} takes decay: {gating}, beta: {delta}; the inputs given do not match")
    b, t = q.shape[:2]
    q4, k4, v4 = _heads(q, hq, "query", ctx), _heads(k, hkv, "key", ctx), _heads(v, hkv, "value", ctx)
    dk, dv, group = q4.shape[-1], v4.shape[-1], hq // hkv
    if decay is not None:
        dt = ctx.t(decay).astype(dtypes.float32)
        per_head = dt.shape[-1] == hkv
        decay4 = dt.reshape(b, t, hkv, 1).permute(0, 2, 1, 3) if per_head else _heads(dt, hkv, "decay", ctx)
    if beta is not None:
        bt = ctx.t(beta).astype(dtypes.float32)
        beta4 = bt.reshape(b, t, bt.shape[-1], 1).permute(0, 2, 1, 3)
    if past is not None:
        if tuple(past.shape) != (b, hkv, dk, dv):
            raise ctx.error(f"past_state {tuple(past.shape)} must be {(b, hkv, dk, dv)}")
        state = ctx.t(past).astype(dtypes.float32)
    else:
        state = Tensor.zeros(b, hkv, dk, dv, dtype="float32", device=q.device)
    scale = float(ctx.attr("scale", 0.0)) or 1.0 / float(np.sqrt(dk))
    outs = []
    for i in range(t):
        k_t, v_t = k4[:, :, i, :], v4[:, :, i, :]
        if gating:
            state = state * decay4[:, :, i, :].exp().unsqueeze(-1)
        if delta:
            retrieved = (state * k_t.unsqueeze(-1)).sum(-2)
            v_t = beta4[:, :, i, :] * (v_t - retrieved)
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        read = state if group == 1 else state.unsqueeze(2).expand(b, hkv, group, dk, dv).reshape(b, hq, dk, dv)
        outs.append((q4[:, :, i, :].unsqueeze(-1) * read).sum(-2) * scale)
    out = stack(outs, 2).permute(0, 2, 1, 3).reshape(b, t, hq * dv).astype(q.dtype)
    present = state.astype(ctx.t(past).dtype if past is not None else q.dtype)
    return [out, present]


register("LinearAttention", _linear_attention)
