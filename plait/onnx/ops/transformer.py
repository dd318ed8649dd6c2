"""Transformer building blocks: RotaryEmbedding and SwiGLU, as elementwise plait ops (plus a row gather of the
cos/sin caches when position ids are given)."""

from __future__ import annotations

from typing import Any

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
