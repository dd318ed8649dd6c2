"""Scatters: ScatterElements (and the old Scatter), ScatterND, TensorScatter.

Each turns its indices into flat element offsets of the data (index arithmetic with plait ops, on the device when
the indices are a device tensor) and calls the `scatter_flat` kernel once, which applies the updates in order
with the node's reduction. Indices known when the plan is built are range-checked then; indices computed on the
device cannot be checked without a host round trip, and an out-of-range one is skipped (docs/onnx.md, Limits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.graph.ops.scatter import scatter_flat
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


def coords_offset(index_shape: tuple[int, ...], data_strides: list[int], skip: set[int]) -> np.ndarray:
    """The flat offset contributed by each position's own coordinates along every axis not in `skip`."""
    nd = len(index_shape)
    base = np.zeros(index_shape, np.int64)
    for d in range(nd):
        if d not in skip:
            base = base + np.arange(index_shape[d]).reshape([-1 if i == d else 1 for i in range(nd)]) * data_strides[d]
    return base


def normalise_index(ctx: Ctx, idx: Value, size: int, what: str, total: int) -> Value:
    """Negative indices count from the end; host indices are range-checked now, with the node named. A device
    index out of range becomes -(total + 1), which makes its flat offset into a data of `total` elements negative
    (whatever the other coordinates add), so the scatter kernel skips it instead of writing to another row."""
    if isinstance(idx, np.ndarray):
        i = np.where(idx < 0, idx + size, idx).astype(np.int64)
        if i.size and (i.min() < 0 or i.max() >= size):
            bad = int(idx.reshape(-1)[np.argmax(((i < 0) | (i >= size)).reshape(-1))])
            raise ctx.error(f"{what} index {bad} is out of range for size {size}")
        return i
    it = idx.astype(dtypes.int64)
    it = where(it < 0, it + size, it)
    return where((it < 0) | (it >= size), -(total + 1), it)


def apply_scatter(ctx: Ctx, data: Tensor, offsets: Value, updates: Value, reduction: str) -> Tensor:
    """data with updates written (or combined by `reduction`) at the given flat element offsets."""
    if reduction not in _REDUCTION:
        raise ctx.unsupported(f"reduction {reduction!r} (supported: {sorted(_REDUCTION)})")
    off = ctx.t(np.ascontiguousarray(offsets, np.int64) if isinstance(offsets, np.ndarray) else offsets)
    upd = ctx.t(updates).astype(data.dtype)
    if math.prod(off.shape) != math.prod(upd.shape):
        raise ctx.error(f"{math.prod(upd.shape)} updates {upd.shape} for {math.prod(off.shape)} indices")
    flat = scatter_flat(data.reshape(-1).node, off.reshape(-1).node, upd.reshape(-1).node, _REDUCTION[reduction])
    return Tensor(flat).reshape(*data.shape)


def _scatter_elements(ctx: Ctx, ins: list[Any]) -> Tensor:
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
    st = strides(data.shape)
    base = coords_offset(tuple(idx.shape), st, {a})
    i = normalise_index(ctx, idx, data.shape[a], f"axis-{a}", math.prod(data.shape))
    off = base + i * st[a] if isinstance(i, np.ndarray) else i * st[a] + ctx.t(base)
    return apply_scatter(ctx, data, off, upd, ctx.attr("reduction", "none"))


register("ScatterElements", _scatter_elements)
register("Scatter", _scatter_elements)


def _scatter_nd(ctx: Ctx, ins: list[Any]) -> Tensor:
    data, idx, upd = ctx.t(ins[0]), ins[1], ins[2]
    q = idx.shape[-1]
    lead = tuple(idx.shape[:-1])
    tail = data.shape[q:]
    if q > data.ndim or tuple(upd.shape) != lead + tail:
        raise ctx.error(
            f"indices {tuple(idx.shape)} and updates {tuple(upd.shape)} do not fit data {data.shape} (updates must"
            f" have shape indices.shape[:-1] + data.shape[{q}:] = {lead + tail})"
        )
    st = strides(data.shape)
    block = np.arange(math.prod(tail), dtype=np.int64).reshape((1,) * len(lead) + (-1,))
    if isinstance(idx, np.ndarray):
        flat = sum(
            (
                normalise_index(ctx, idx[..., j], data.shape[j], f"axis-{j}", math.prod(data.shape)) * st[j]
                for j in range(q)
            ),
            np.zeros(lead, np.int64),
        )
        off: Value = np.asarray(flat)[..., None] + block
    else:
        acc = Tensor.zeros(*lead, dtype="int64", device=data.device)
        for j in range(q):
            acc = acc + normalise_index(ctx, idx[..., j], data.shape[j], f"axis-{j}", math.prod(data.shape)) * st[j]
        off = acc.unsqueeze(-1) + ctx.t(block)
    return apply_scatter(ctx, data, off, upd, ctx.attr("reduction", "none"))


register("ScatterND", _scatter_nd)


def _tensor_scatter(ctx: Ctx, ins: list[Any]) -> Tensor:
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
    length, seq = cache.shape[a], ushape[a]
    if seq > length:
        raise ctx.error(f"update length {seq} on axis {a} is longer than the cache's {length}")
    st = strides(cache.shape)
    base = coords_offset(ushape, st, {a})
    steps = np.arange(seq, dtype=np.int64).reshape([-1 if d == a else 1 for d in range(nd)])
    bshape = [cache.shape[0]] + [1] * (nd - 1)
    wi = ins[2] if len(ins) > 2 and ins[2] is not None else np.zeros(cache.shape[0], np.int64)
    if isinstance(wi, np.ndarray):
        pos: Value = wi.astype(np.int64).reshape(bshape) + steps
        pos = pos % length if mode == "circular" else pos
        if mode == "linear" and pos.size and (pos.min() < 0 or pos.max() >= length):
            raise ctx.error(f"write_indices {wi.tolist()} + update length {seq} run past the cache length {length}")
        off: Value = base + pos * st[a]
    else:
        p = wi.astype(dtypes.int64).reshape(*bshape) + ctx.t(steps)
        p = p % length if mode == "circular" else p
        off = where((p < 0) | (p >= length), -1, p * st[a] + ctx.t(base))  # -1: skipped, not another row
    return apply_scatter(ctx, cache, off, upd, "none")


register("TensorScatter", _tensor_scatter)
