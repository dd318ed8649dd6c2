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
