"""Sorting, selection and scans: TopK, CumProd, ReverseSequence, CenterCropPad, Compress, NonZero, Unique.

TopK ranks on the device (the `topk_rows` kernel) and gathers the values. Compress, NonZero and Unique have an
output shape that depends on data values, so they read those values when the plan is built (`ctx.host`): a
value from a graph input makes the session specialise its plan on that input's contents, which costs a compile
per distinct value (docs/onnx.md, Limits). Compress only reads its condition; the data stays on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.graph.ops import indexing
from plait.graph.ops.scatter import topk_rows
from plait.onnx.importer import Ctx
from plait.onnx.ops import register

Value = Tensor | np.ndarray


def axis_of(ctx: Ctx, a: int, nd: int) -> int:
    """`a` as a non-negative axis of a rank-`nd` tensor, or an error naming the node."""
    if not -nd <= a < max(nd, 1):
        raise ctx.error(f"axis {a} is out of range for rank {nd}")
    return a % nd if nd else 0


def take(x: Tensor, index: Tensor, axis: int) -> Tensor:
    """x gathered along `axis` at a 1-D integer index (a device gather; the index may be a computed tensor)."""
    nd = x.ndim
    moved = x.permute(axis, *(d for d in range(nd) if d != axis))
    rows = moved.reshape(x.shape[axis], -1)
    out = Tensor(indexing.gather_rows(rows.node, index.astype(dtypes.int64).node))
    out = out.reshape(index.shape[0], *moved.shape[1:])
    back = [*range(1, axis + 1), 0, *range(axis + 1, nd)]
    return out.permute(*back)


def _to_last(x: Tensor, a: int) -> Tensor:
    return x if a == x.ndim - 1 else x.transpose(a, -1)


def _topk(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    x = ctx.t(ins[0])
    a = axis_of(ctx, int(ctx.attr("axis", -1)), x.ndim)
    k = int(ctx.host(ins[1], "K").reshape(-1)[0]) if ctx.opset >= 10 else int(ctx.attr("k"))
    n = x.shape[a]
    if not 0 <= k <= n:
        raise ctx.error(f"K={k} is outside [0, {n}] (the size of axis {a} of input {x.shape})")
    moved = _to_last(x, a)
    lead = moved.shape[:-1]
    rows = moved.reshape(-1, n)
    idx = Tensor(topk_rows(rows.node, k, bool(ctx.attr("largest", 1))))
    offsets = idx + ctx.t(np.arange(rows.shape[0], dtype=np.int64)[:, None] * n)
    flat = Tensor(indexing.gather_rows(rows.reshape(-1, 1).node, offsets.reshape(-1).node))
    values = flat.reshape(*lead, k)
    indices = idx.reshape(*lead, k)
    return [_to_last(values, a), _to_last(indices, a)]


register("TopK", _topk)


def _cumprod(ctx: Ctx, ins: list[Any]) -> Tensor:
    """An inclusive product scan in log2(n) steps of shifted elementwise products (Hillis-Steele), exact for
    integers and in the usual float rounding for floats."""
    x = ctx.t(ins[0])
    a = axis_of(ctx, int(ctx.host(ins[1], "axis").reshape(-1)[0]), x.ndim)
    rev, excl = bool(ctx.attr("reverse", 0)), bool(ctx.attr("exclusive", 0))
    n = x.shape[a]
    y = x.flip(a) if rev else x

    def shifted(t: Tensor, s: int) -> Tensor:
        pairs = [(0, 0)] * t.ndim
        pairs[a] = (s, -s)  # s ones in front, the last s elements dropped
        return t.pad(pairs, 1.0)

    if excl and n:
        y = shifted(y, 1)
    s = 1
    while s < n:
        y = y * shifted(y, s)
        s *= 2
    return y.flip(a) if rev else y


register("CumProd", _cumprod)


def _reverse_sequence(ctx: Ctx, ins: list[Any]) -> Tensor:
    """Each batch entry's first len[b] steps reversed: a gather whose source step is computed on the device."""
    x = ctx.t(ins[0])
    ba, ta = int(ctx.attr("batch_axis", 1)), int(ctx.attr("time_axis", 0))
    if x.ndim < 2 or {ba, ta} != {0, 1}:
        raise ctx.error(f"batch_axis {ba} and time_axis {ta} must be 0 and 1 (in some order) of a rank >= 2 input")
    lens = ctx.t(ins[1]).astype(dtypes.int64)
    b, t = x.shape[ba], x.shape[ta]
    if lens.shape != (b,):
        raise ctx.error(f"sequence_lens {lens.shape} must have one entry per batch entry ({b})")
    steps = ctx.t(np.arange(t, dtype=np.int64)[:, None])  # (T, 1) against lens (1, B)
    ln = lens.reshape(1, b)
    src = where(steps < ln, ln - 1 - steps, steps)  # (T, B): the source step of each (step, batch) position
    tb = x if ta == 0 else x.transpose(0, 1)  # (T, B, ...)
    rows = tb.reshape(t * b, -1)
    flat = src * b + ctx.t(np.arange(b, dtype=np.int64)[None, :])
    out = Tensor(indexing.gather_rows(rows.node, flat.reshape(-1).node)).reshape(*tb.shape)
    return out if ta == 0 else out.transpose(0, 1)


register("ReverseSequence", _reverse_sequence)


def _center_crop_pad(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    nd = len(x.shape)
    shape = ctx.ints(ins[1], "shape")
    axes = [axis_of(ctx, int(v), nd) for v in ctx.attr("axes", range(nd))]
    if len(shape) != len(axes):
        raise ctx.error(f"shape {shape} needs one entry per axis {axes}")
    pairs = [(0, 0)] * nd
    for a, want in zip(axes, shape, strict=True):
        d = want - x.shape[a]  # > 0 pads, < 0 crops; an odd amount puts the extra element at the end
        m = abs(d)
        sign = 1 if d > 0 else -1
        pairs[a] = (sign * (m // 2), sign * (m - m // 2))
    return ctx.t(x).pad(pairs, 0.0)


register("CenterCropPad", _center_crop_pad)


def _compress(ctx: Ctx, ins: list[Any]) -> Value:
    cond = ctx.host(ins[1], "condition").reshape(-1).astype(bool)
    x = ins[0]
    axis = ctx.attr("axis")
    if axis is None:
        x = x.reshape(-1)
        a = 0
    else:
        a = axis_of(ctx, int(axis), len(x.shape))
    n = x.shape[a]
    if cond.size > n:
        raise ctx.error(f"condition has {cond.size} entries but axis {a} has only {n}")
    keep = np.flatnonzero(cond)
    if isinstance(x, np.ndarray):
        return np.take(x, keep, axis=a)
    if keep.size == 0:
        return Tensor.zeros(*(0 if d == a else s for d, s in enumerate(x.shape)), dtype=x.dtype, device=x.device)
    return take(x, ctx.t(keep.astype(np.int64)), a)


register("Compress", _compress)


def _nonzero(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    x = ctx.host(ins[0], "X")
    return np.array(np.nonzero(x.reshape(1) if x.ndim == 0 else x), dtype=np.int64)


register("NonZero", _nonzero, _nonzero)


def _unique(ctx: Ctx, ins: list[Any]) -> list[np.ndarray]:
    x = ctx.host(ins[0], "X")
    axis = ctx.attr("axis")
    a = None if axis is None else axis_of(ctx, int(axis), x.ndim)
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=a)
    if not ctx.attr("sorted", 1):  # order of first occurrence instead of sorted order
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
        y = np.take(x if a is not None else x.reshape(-1), first, axis=a or 0)
    i64 = np.int64
    return [y, first.astype(i64), inverse.reshape(-1).astype(i64), counts.astype(i64)]


register("Unique", _unique, _unique)
