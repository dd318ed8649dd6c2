"""Shape and movement ONNX ops: Shape, Reshape, Transpose, (Un)Squeeze, Flatten, Concat, Split, Slice, Gather*,
Expand, Tile, Pad, ConstantOfShape, Constant, Range, DepthToSpace, SpaceToDepth, Trilu, OneHot, EyeLike.

Attributes that became inputs (Reshape's shape, Slice's starts/ends, (Un)Squeeze's axes from opset 13, Split's
sizes from 13, Pad's pads from 11) are read through `ctx.host`, so they must be known when the plan is built.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, broadcast_shape, cat, where
from plait.graph.ops import indexing
from plait.onnx.importer import Ctx
from plait.onnx.loader import elem_np
from plait.onnx.ops import register

Value = Tensor | np.ndarray


def _axis(ctx: Ctx, a: int, ndim: int) -> int:
    if not -ndim <= a < max(ndim, 1):
        raise ctx.error(f"axis {a} is out of range for rank {ndim}")
    return a % ndim if ndim else 0


# ---------------------------------------------------------------- shape queries and constants


def _shape(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    shape = list(ins[0].shape)
    n = len(shape)
    start = ctx.attr("start", 0)
    end = ctx.attr("end", n)
    start = min(max(start + n if start < 0 else start, 0), n)
    end = min(max(end + n if end < 0 else end, 0), n)
    return np.array(shape[start:end], dtype=np.int64)


register("Shape", _shape, _shape)
register(
    "Size",
    lambda ctx, ins: np.array(math.prod(ins[0].shape), np.int64),
    lambda ctx, ins: np.array(ins[0].size, np.int64),
)


def _constant(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    for key, dt in (
        ("value", None),
        ("value_float", np.float32),
        ("value_floats", np.float32),
        ("value_int", np.int64),
        ("value_ints", np.int64),
    ):
        if key in ctx.attrs:
            return np.array(ctx.attrs[key], dtype=dt)
    raise ctx.unsupported(f"Constant with attributes {sorted(ctx.attrs)} is not supported")


register("Constant", _constant, _constant)


def _constant_of_shape(ctx: Ctx, ins: list[Any]) -> Value:
    shape = tuple(ctx.ints(ins[0], "shape"))
    value = ctx.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full(shape, fill[0], dtype=fill.dtype)


register("ConstantOfShape", _constant_of_shape, _constant_of_shape)


def _range(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    start, limit, delta = (ctx.host(x, n) for x, n in zip(ins, ("start", "limit", "delta"), strict=True))
    dt = np.result_type(start, limit, delta)
    return np.arange(start.item(), limit.item(), delta.item()).astype(dt)


register("Range", _range, _range)


def _eyelike(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    shape = ins[0].shape
    dt = (
        elem_np(ctx.attr("dtype"))
        if ctx.attr("dtype") is not None
        else (ins[0].dtype if isinstance(ins[0], np.ndarray) else ins[0].dtype.np)
    )
    return np.eye(shape[0], shape[1], k=int(ctx.attr("k", 0)), dtype=dt)


register("EyeLike", _eyelike, _eyelike)

# ---------------------------------------------------------------- reshapes


def _reshape_target(ctx: Ctx, in_shape: tuple[int, ...], shape: list[int]) -> tuple[int, ...]:
    allowzero = ctx.attr("allowzero", 0)
    out = [in_shape[i] if s == 0 and not allowzero else s for i, s in enumerate(shape)]
    if out.count(-1) > 1:
        raise ctx.error(f"reshape target {shape} has more than one -1")
    if -1 in out:
        known = math.prod(s for s in out if s != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    if math.prod(out) != math.prod(in_shape):
        raise ctx.error(f"cannot reshape {in_shape} to {shape}")
    return tuple(out)


def _reshape(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    shape = ctx.ints(ins[1], "shape") if ctx.opset >= 5 else list(ctx.attr("shape"))
    target = _reshape_target(ctx, tuple(x.shape), shape)
    return x.reshape(target)


register("Reshape", _reshape, _reshape)


def _flatten(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    nd = len(x.shape)
    a = int(ctx.attr("axis", 1))
    if not -nd <= a <= nd:
        raise ctx.error(f"axis {a} is out of range for rank {nd}")
    a = a + nd if a < 0 else a
    return x.reshape((math.prod(x.shape[:a]), math.prod(x.shape[a:])))


register("Flatten", _flatten, _flatten)


def _axes_of(ctx: Ctx, ins: list[Any]) -> list[int] | None:
    if ctx.opset >= 13:
        return ctx.ints(ins[1], "axes") if len(ins) > 1 and ins[1] is not None else None
    axes = ctx.attr("axes")
    return list(axes) if axes is not None else None


def _squeeze(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    axes = _axes_of(ctx, ins)
    nd = len(x.shape)
    drop = {i for i, s in enumerate(x.shape) if s == 1} if axes is None else {_axis(ctx, a, nd) for a in axes}
    for a in drop:
        if x.shape[a] != 1:
            raise ctx.error(f"cannot squeeze axis {a} of size {x.shape[a]} (shape {tuple(x.shape)})")
    return x.reshape(tuple(s for i, s in enumerate(x.shape) if i not in drop))


def _unsqueeze(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    axes = _axes_of(ctx, ins)
    if axes is None:
        raise ctx.error("Unsqueeze needs axes")
    nd = len(x.shape) + len(axes)
    new = {_axis(ctx, a, nd) for a in axes}
    it = iter(x.shape)
    return x.reshape(tuple(1 if i in new else next(it) for i in range(nd)))


register("Squeeze", _squeeze, _squeeze)
register("Unsqueeze", _unsqueeze, _unsqueeze)


def _transpose(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    perm = ctx.attr("perm")
    perm = list(reversed(range(len(x.shape)))) if perm is None else list(perm)
    return np.transpose(x, perm) if isinstance(x, np.ndarray) else x.permute(*perm)


register("Transpose", _transpose, _transpose)


def _depth_to_space(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    b = int(ctx.attr("blocksize"))
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _space_to_depth(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    b = int(ctx.attr("blocksize"))
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b)
    y = y.permute(0, 1, 3, 5, 2, 4) if ctx.attr("mode", "DCR") == "CRD" else y.permute(0, 3, 5, 1, 2, 4)
    return y.reshape(n, c * b * b, h // b, w // b)


register("DepthToSpace", _depth_to_space)
register("SpaceToDepth", _space_to_depth)

# ---------------------------------------------------------------- joins and splits


def _concat(ctx: Ctx, ins: list[Any]) -> Tensor:
    parts = [x for x in ins if x is not None]
    a = _axis(ctx, ctx.attr("axis"), len(parts[0].shape))
    ts = [ctx.t(x) for x in parts]
    dt = next((t.dtype for t, x in zip(ts, parts, strict=True) if isinstance(x, Tensor)), ts[0].dtype)
    return cat([t.astype(dt) for t in ts], a)


def _fold_concat(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    parts = [x for x in ins if x is not None]
    return np.concatenate(parts, axis=_axis(ctx, ctx.attr("axis"), parts[0].ndim))


register("Concat", _concat, _fold_concat)


def _split_sizes(ctx: Ctx, ins: list[Any], n: int) -> list[int]:
    x = ins[0]
    a = _axis(ctx, ctx.attr("axis", 0), len(x.shape))
    size = x.shape[a]
    sizes = None
    if ctx.opset >= 13 and len(ins) > 1 and ins[1] is not None:
        sizes = ctx.ints(ins[1], "split")
    elif ctx.opset < 13 and ctx.attr("split") is not None:
        sizes = list(ctx.attr("split"))
    if sizes is None:
        parts = int(ctx.attr("num_outputs", n))
        chunk = -(-size // parts)
        sizes = [min(chunk, size - i * chunk) for i in range(parts)]
    if sum(sizes) != size:
        raise ctx.error(f"split sizes {sizes} do not add up to {size}")
    return sizes


def _split(ctx: Ctx, ins: list[Any]) -> list[Value]:
    x = ins[0]
    a = _axis(ctx, ctx.attr("axis", 0), len(x.shape))
    sizes = _split_sizes(ctx, ins, len(ctx.node.output))
    outs, start = [], 0
    for s in sizes:
        idx = tuple(slice(None) if i != a else slice(start, start + s) for i in range(len(x.shape)))
        outs.append(x[idx])
        start += s
    return outs


register("Split", _split, _split)


def _slice_keys(ctx: Ctx, ins: list[Any]) -> tuple[slice, ...]:
    x = ins[0]
    nd = len(x.shape)
    if ctx.opset < 10:
        starts, ends = list(ctx.attr("starts")), list(ctx.attr("ends"))
        axes = list(ctx.attr("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts, ends = ctx.ints(ins[1], "starts"), ctx.ints(ins[2], "ends")
        axes = ctx.ints(ins[3], "axes") if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
        steps = ctx.ints(ins[4], "steps") if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    keys = [slice(None)] * nd
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        if st == 0:
            raise ctx.error("Slice step 0 is invalid")
        size = x.shape[_axis(ctx, a, nd)]
        big = 2 * size + 2  # clamp huge sentinels (INT64_MAX/MIN) to values Python slices treat the same
        keys[_axis(ctx, a, nd)] = slice(max(min(s, big), -big), max(min(e, big), -big), st)
    return tuple(keys)


def _slice(ctx: Ctx, ins: list[Any]) -> Value:
    return ins[0][_slice_keys(ctx, ins)]


register("Slice", _slice, _slice)


def _expand(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    shape = tuple(ctx.ints(ins[1], "shape"))
    target = broadcast_shape(tuple(x.shape), shape, op=ctx.label)
    if isinstance(x, np.ndarray):
        return np.broadcast_to(x, target).copy()
    return x.expand(*target)


register("Expand", _expand, _expand)


def _tile(ctx: Ctx, ins: list[Any]) -> Value:
    x = ins[0]
    reps = ctx.ints(ins[1], "repeats")
    if isinstance(x, np.ndarray):
        return np.tile(x, reps)
    shape = x.shape
    inter = tuple(v for s in shape for v in (1, s))
    big = tuple(v for r, s in zip(reps, shape, strict=True) for v in (r, s))
    return x.reshape(*inter).expand(*big).reshape(*(r * s for r, s in zip(reps, shape, strict=True)))


register("Tile", _tile, _tile)


def _pad(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    nd = x.ndim
    pads = ctx.ints(ins[1], "pads") if ctx.opset >= 11 else list(ctx.attr("pads"))
    value = 0.0
    if ctx.opset >= 11 and len(ins) > 2 and ins[2] is not None:
        value = float(ctx.host(ins[2], "constant_value").reshape(-1)[0]) if ctx.host(ins[2], "c").size else 0.0
    elif ctx.opset < 11:
        value = float(ctx.attr("value", 0.0))
    axes = list(range(nd))
    if len(ins) > 3 and ins[3] is not None:
        axes = [_axis(ctx, a, nd) for a in ctx.ints(ins[3], "axes")]
    k = len(axes)
    pairs = [(0, 0)] * nd
    for i, a in enumerate(axes):
        pairs[a] = (pads[i], pads[i + k])
    mode = ctx.attr("mode", "constant")
    if mode == "constant":
        return x.pad(pairs, value)
    for a, (lo, hi) in enumerate(pairs):
        if lo or hi:
            x = _pad_axis(ctx, x, a, lo, hi, mode)
    return x


def _pad_axis(ctx: Ctx, x: Tensor, a: int, lo: int, hi: int, mode: str) -> Tensor:
    n = x.shape[a]

    def take(i: int) -> Tensor:
        key = tuple(slice(i, i + 1) if d == a else slice(None) for d in range(x.ndim))
        return x[key]

    if mode == "edge":
        before = [take(0)] * lo
        after = [take(n - 1)] * hi
    elif mode == "reflect":
        before = [take(lo - i) for i in range(lo)]
        after = [take(n - 2 - i) for i in range(hi)]
    elif mode == "wrap":
        before = [take((n - lo + i) % n) for i in range(lo)]
        after = [take(i % n) for i in range(hi)]
    else:
        raise ctx.unsupported(f"Pad mode {mode!r}")
    return cat([*before, x, *after], a)


register("Pad", _pad)

# ---------------------------------------------------------------- gathers


def _gather_flat(data: Tensor, flat: Tensor) -> Tensor:
    """data.reshape(-1)[flat] for an integer index tensor of any shape."""
    rows = Tensor(indexing.gather_rows(data.reshape(-1, 1).node, flat.reshape(-1).astype(dtypes.int64).node))
    return rows.reshape(*flat.shape)


def _gather(ctx: Ctx, ins: list[Any]) -> Value:
    data, idx = ins[0], ins[1]
    nd = len(data.shape)
    a = _axis(ctx, ctx.attr("axis", 0), nd)
    n = data.shape[a]
    if isinstance(idx, np.ndarray):
        idx = np.where(idx < 0, idx + n, idx).astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ctx.error(
                f"index {int(idx.max() if idx.max() >= n else idx.min())} is out of range for axis {a} of size {n}"
            )
        if isinstance(data, np.ndarray):
            return np.take(data, idx, axis=a)
        if idx.ndim == 0:
            return data[tuple(slice(None) if d != a else int(idx) for d in range(nd))]
    t = ctx.t(data)
    it = ctx.t(idx)
    it = where(it < 0, it + n, it)
    rest = t.shape[:a] + t.shape[a + 1 :]
    table = t.permute(a, *(d for d in range(nd) if d != a)).reshape(n, -1)
    rows = Tensor(indexing.gather_rows(table.node, it.reshape(-1).astype(dtypes.int64).node))
    out = rows.reshape(*it.shape, *rest)  # (idx..., before..., after...)
    k = it.ndim
    perm = [k + i for i in range(a)] + list(range(k)) + [k + i for i in range(a, nd - 1)]
    return out.permute(*perm)


register("Gather", _gather, _gather)


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def _gather_elements(ctx: Ctx, ins: list[Any]) -> Tensor:
    data = ctx.t(ins[0])
    nd = data.ndim
    a = _axis(ctx, ctx.attr("axis", 0), nd)
    idx = ins[1]
    st = _strides(data.shape)
    shape = tuple(idx.shape)
    base = np.zeros(shape, np.int64)
    for d in range(nd):
        if d != a:
            coord = np.arange(shape[d]).reshape([-1 if i == d else 1 for i in range(nd)])
            base = base + coord * st[d]
    if isinstance(idx, np.ndarray):
        i = np.where(idx < 0, idx + data.shape[a], idx)
        return _gather_flat(data, ctx.t(base + i.astype(np.int64) * st[a]))
    it = idx.astype(dtypes.int64)
    it = where(it < 0, it + data.shape[a], it)
    return _gather_flat(data, it * st[a] + ctx.t(base))


register("GatherElements", _gather_elements)


def _gather_nd(ctx: Ctx, ins: list[Any]) -> Tensor:
    data = ctx.t(ins[0])
    idx = ctx.t(ins[1]).astype(dtypes.int64)
    b = int(ctx.attr("batch_dims", 0))
    k = idx.shape[-1]
    st = _strides(data.shape)
    lead = idx.shape[:-1]
    flat = Tensor.zeros(*lead, dtype="int64", device=data.device)
    for d in range(b):
        coord = np.arange(lead[d]).reshape([-1 if i == d else 1 for i in range(len(lead))])
        flat = flat + ctx.t(coord * st[d])
    for j in range(k):
        col = idx[..., j]
        col = where(col < 0, col + data.shape[b + j], col)
        flat = flat + col * st[b + j]
    tail = data.shape[b + k :]
    if not tail:
        return _gather_flat(data, flat)
    m = math.prod(tail)
    table = data.reshape(-1, m)
    sel = Tensor(indexing.gather_rows(table.node, _row_index(flat, m).reshape(-1).node))
    return sel.reshape(*lead, *tail)


def _row_index(flat: Tensor, m: int) -> Tensor:
    """Element offsets of whole trailing blocks, as row numbers of a (-1, m) view (offsets are multiples of m)."""
    return (flat.astype(dtypes.float32) / float(m)).astype(dtypes.int64)


register("GatherND", _gather_nd)


def _onehot(ctx: Ctx, ins: list[Any]) -> Tensor:
    idx = ctx.t(ins[0])
    depth = int(ctx.host(ins[1], "depth").reshape(-1)[0])
    values = ins[2]
    nd = idx.ndim + 1
    a = _axis(ctx, ctx.attr("axis", -1), nd)
    i = idx.astype(dtypes.int64)
    i = where(i < 0, i + depth, i)
    classes = np.arange(depth).reshape([-1 if d == a else 1 for d in range(nd)])
    hit = i.unsqueeze(a) == ctx.t(classes)
    v = ctx.t(values)
    return where(hit, v[1], v[0])


register("OneHot", _onehot)


def _trilu(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    k = int(ctx.host(ins[1], "k").reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
    r, c = x.shape[-2], x.shape[-1]
    rows, cols = np.arange(r)[:, None], np.arange(c)[None, :]
    keep = (cols - rows >= k) if ctx.attr("upper", 1) else (cols - rows <= k)
    zero = Tensor.full((), 0, x.dtype, x.device)
    return where(ctx.t(keep), x, zero)


register("Trilu", _trilu)
