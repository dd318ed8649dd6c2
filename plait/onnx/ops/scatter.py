"""Scatters: ScatterElements (and the old Scatter), ScatterND, TensorScatter.

Each views the data as rows and its indices as positions within them (index arithmetic with plait ops, on the
device when the indices are a device tensor) and calls the `scatter_rows` kernel once, which applies each row's
updates in order with the node's reduction. Indices known when the plan is built are range-checked then; indices computed on the
device cannot be checked without a host round trip, and an out-of-range one is skipped (docs/onnx.md, Limits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.graph.ops.scatter import scatter_rows
from plait.onnx.importer import Ctx
from plait.onnx.ops import register

Value = Tensor | np.ndarray

_REDUCTION = {"none": "none", "add": "add", "mul": "mul", "max": "max", "min": "min"}


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major element strides of `shape`."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def normalise_index(ctx: Ctx, idx: Value, size: int, what: str) -> Value:
    """Negative indices count from the end; host indices are range-checked now, with the node named. A device
    index stays out of range if it was, and the scatter kernel skips it."""
    if isinstance(idx, np.ndarray):
        i = np.where(idx < 0, idx + size, idx).astype(np.int64)
        if i.size and (i.min() < 0 or i.max() >= size):
            bad = int(idx.reshape(-1)[np.argmax(((i < 0) | (i >= size)).reshape(-1))])
            raise ctx.error(f"{what} index {bad} is out of range for size {size}")
        return i
    it = idx.astype(dtypes.int64)
    return where(it < 0, it + size, it)


def apply_scatter(ctx: Ctx, data: Tensor, index: Value, updates: Value, reduction: str) -> Tensor:
    """data (R, L) with each row's updates (R, K) written (or combined by `reduction`) at its positions (R, K)."""
    if reduction not in _REDUCTION:
        raise ctx.unsupported(f"reduction {reduction!r} (supported: {sorted(_REDUCTION)})")
    idx = ctx.t(np.ascontiguousarray(index, np.int64) if isinstance(index, np.ndarray) else index)
    upd = ctx.t(updates).astype(data.dtype)
    if idx.shape != upd.shape or idx.ndim != 2 or idx.shape[0] != data.shape[0]:
        raise ctx.error(f"updates {upd.shape} and indices {idx.shape} do not fit rows of {data.shape}")
    return Tensor(scatter_rows(data.node, idx.astype(dtypes.int64).node, upd.node, _REDUCTION[reduction]))


def _pad_to(v: Value, shape: tuple[int, ...], fill: float) -> Value:
    """v padded at the end of each axis up to `shape` with `fill`."""
    pairs = [(0, s - d) for s, d in zip(shape, v.shape, strict=True)]
    if all(hi == 0 for _, hi in pairs):
        return v
    if isinstance(v, np.ndarray):
        return np.pad(v, pairs, constant_values=fill)
    return v.pad(pairs, fill)


def _to_last(v: Value, a: int) -> Value:
    if a == len(v.shape) - 1:
        return v
    return np.moveaxis(v, a, -1) if isinstance(v, np.ndarray) else v.transpose(a, -1)


def _scatter_elements(ctx: Ctx, ins: list[Any]) -> Tensor:
    """A scatter along one axis: that axis becomes the rows' positions; indices and updates smaller than the data
    on the other axes are padded with skipped positions."""
    data, idx, upd = ctx.t(ins[0]), ins[1], ins[2]
    nd = data.ndim
    a = int(ctx.attr("axis", 0))
    if not -nd <= a < nd:
        raise ctx.error(f"axis {a} is out of range for rank {nd}")
    a %= nd
    if len(idx.shape) != nd or tuple(idx.shape) != tuple(upd.shape):
        raise ctx.error(f"indices {tuple(idx.shape)} and updates {tuple(upd.shape)} must have one shape of rank {nd}")
    for d in range(nd):
        if d != a and idx.shape[d] > data.shape[d]:
            raise ctx.error(f"indices {tuple(idx.shape)} are larger than data {data.shape} on axis {d}")
    full = tuple(data.shape[d] if d != a else idx.shape[a] for d in range(nd))
    i = _to_last(_pad_to(normalise_index(ctx, idx, data.shape[a], f"axis-{a}"), full, -1), a)
    u = _to_last(_pad_to(ctx.t(upd).astype(data.dtype), full, 0.0), a)
    moved = _to_last(data, a)
    assert isinstance(moved, Tensor) and isinstance(u, Tensor)
    k = idx.shape[a]
    out = apply_scatter(
        ctx, moved.reshape(-1, data.shape[a]), i.reshape(-1, k), u.reshape(-1, k), ctx.attr("reduction", "none")
    )
    back = out.reshape(*moved.shape)
    return back if a == nd - 1 else back.transpose(a, -1)


register("ScatterElements", _scatter_elements)
register("Scatter", _scatter_elements)


def _scatter_nd(ctx: Ctx, ins: list[Any]) -> Tensor:
    """Whole slices data[i_0, ..., i_q-1] replaced: the data seen as (slice element, slice position), so each
    row is one element of every slice and the updates address slice positions."""
    data, idx, upd = ctx.t(ins[0]), ins[1], ins[2]
    q = idx.shape[-1]
    lead = tuple(idx.shape[:-1])
    tail = data.shape[q:]
    if q > data.ndim or tuple(upd.shape) != lead + tail:
        raise ctx.error(
            f"indices {tuple(idx.shape)} and updates {tuple(upd.shape)} do not fit data {data.shape} (updates must"
            f" have shape indices.shape[:-1] + data.shape[{q}:] = {lead + tail})"
        )
    st = strides(data.shape[:q])
    slices, size, m = math.prod(data.shape[:q]), math.prod(tail), math.prod(lead)
    if isinstance(idx, np.ndarray):
        pos: Value = sum(
            (normalise_index(ctx, idx[..., j], data.shape[j], f"axis-{j}") * st[j] for j in range(q)),
            np.zeros(lead, np.int64),
        )
        pos = np.broadcast_to(np.asarray(pos).reshape(1, m), (size, m))
    else:
        acc = Tensor.zeros(*lead, dtype="int64", device=data.device)
        ok: Tensor | None = None
        for j in range(q):
            c = normalise_index(ctx, idx[..., j], data.shape[j], f"axis-{j}")
            assert isinstance(c, Tensor)
            inside = (c >= 0) & (c < data.shape[j])
            ok = inside if ok is None else ok & inside
            acc = acc + c * st[j]
        if ok is not None:
            acc = where(ok, acc, -1)  # a bad coordinate must not alias another slice
        pos = acc.reshape(1, m).expand(size, m)
    rows = data.reshape(slices, size).transpose(0, 1)
    u = ctx.t(upd).astype(data.dtype).reshape(m, size).transpose(0, 1)
    out = apply_scatter(ctx, rows, pos, u, ctx.attr("reduction", "none"))
    return out.transpose(0, 1).reshape(*data.shape)


register("ScatterND", _scatter_nd)


def _tensor_scatter(ctx: Ctx, ins: list[Any]) -> Tensor:
    """A cache write: each batch entry's update lands at its own write index along the sequence axis (wrapping
    in circular mode); one row per (batch, other axes) position, so a decode step costs O(cache)."""
    cache, upd = ctx.t(ins[0]), ins[1]
    nd = cache.ndim
    a = int(ctx.attr("axis", -2))
    if not -nd <= a < nd or nd < 2:
        raise ctx.error(f"axis {a} is out of range for rank {nd}")
    a %= nd
    if a == 0:
        raise ctx.error("axis 0 is the batch axis; the sequence axis must come after it")
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ctx.unsupported(f"mode {mode!r} (supported: linear, circular)")
    ushape = tuple(upd.shape)
    if len(ushape) != nd or any(u != c for d, (u, c) in enumerate(zip(ushape, cache.shape)) if d != a):
        raise ctx.error(f"update {ushape} does not match cache {cache.shape} outside axis {a}")
    length, seq, batch = cache.shape[a], ushape[a], cache.shape[0]
    if seq > length:
        raise ctx.error(f"update length {seq} on axis {a} is longer than the cache's {length}")
    wi = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros(batch, np.int64)
    steps = np.arange(seq, dtype=np.int64).reshape(1, seq)
    if isinstance(wi, np.ndarray):
        pos: Value = wi.astype(np.int64).reshape(batch, 1) + steps
        pos = pos % length if mode == "circular" else pos
        if mode == "linear" and pos.size and (pos.min() < 0 or pos.max() >= length):
            raise ctx.error(f"write_indices {wi.tolist()} + update length {seq} run past the cache length {length}")
    else:
        p = wi.astype(dtypes.int64).reshape(batch, 1) + ctx.t(steps)
        pos = p % length if mode == "circular" else p  # linear: a position past the end is skipped
    moved = _to_last(cache, a)
    assert isinstance(moved, Tensor)
    per = math.prod(moved.shape[1:-1])  # rows of one batch entry
    rows = moved.reshape(-1, length)
    u = _to_last(ctx.t(upd).astype(cache.dtype), a)
    assert isinstance(u, Tensor)
    idx = ctx.t(pos).reshape(batch, 1, seq).expand(batch, per, seq).reshape(-1, seq)
    out = apply_scatter(ctx, rows, idx, u.reshape(-1, seq), "none").reshape(*moved.shape)
    return out if a == nd - 1 else out.transpose(a, -1)


register("TensorScatter", _tensor_scatter)
