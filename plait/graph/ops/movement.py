"""Movement ops: views that change how elements are addressed, never the values.

reshape, permute, expand, pad (with a fill value), shrink (start/stop/step per axis), flip, cat. Codegen turns
them into index arithmetic inside the consuming kernel, so none of them copies memory on its own.
"""

from __future__ import annotations

import math

from plait.errors import ShapeError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


def reshape(x: Node, shape: tuple[int, ...]) -> Node:
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != x.size or any(s < 0 for s in shape):
        raise ShapeError(
            f"reshape: cannot view shape {x.shape} ({x.size} elements) as {shape}; the new sizes must be"
            " non-negative with the same product (one -1 may stand for the rest)"
        )
    if shape == x.shape:
        return x
    if x.op == "reshape" and not x.realized:
        return reshape(x.srcs[0], shape)
    return Node("reshape", (x,), shape, shape, x.dtype, x.device)


def permute(x: Node, perm: tuple[int, ...]) -> Node:
    perm = tuple(int(p) for p in perm)
    if sorted(perm) != list(range(len(x.shape))):
        raise ShapeError(f"permute: {perm} is not a permutation of the {len(x.shape)} axes of shape {x.shape}")
    if perm == tuple(range(len(perm))):
        return x
    return Node("permute", (x,), perm, tuple(x.shape[p] for p in perm), x.dtype, x.device)


def expand(x: Node, shape: tuple[int, ...]) -> Node:
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(x.shape) or any(a != b and a != 1 for a, b in zip(x.shape, shape, strict=True)):
        raise ShapeError(f"expand: cannot broadcast shape {x.shape} to {shape}")
    if shape == x.shape:
        return x
    return Node("expand", (x,), shape, shape, x.dtype, x.device)


def pad(x: Node, pads: tuple[tuple[int, int], ...], value: float = 0.0) -> Node:
    pads = tuple((int(a), int(b)) for a, b in pads)
    if len(pads) != len(x.shape) or any(a < 0 or b < 0 for a, b in pads):
        raise ShapeError(f"pad: need one non-negative (before, after) pair per axis of {x.shape}, got {pads}")
    if all(a == 0 and b == 0 for a, b in pads):
        return x
    shape = tuple(s + a + b for s, (a, b) in zip(x.shape, pads, strict=True))
    return Node("pad", (x,), (pads, value), shape, x.dtype, x.device)


def shrink(x: Node, box: tuple[tuple[int, int, int], ...]) -> Node:
    """Keep elements start, start+step, ... < stop on each axis (step >= 1)."""
    box = tuple((int(a), int(b), int(c)) for a, b, c in box)
    if len(box) != len(x.shape):
        raise ShapeError(f"shrink: need one (start, stop, step) per axis of {x.shape}, got {box}")
    for (a, b, c), s in zip(box, x.shape, strict=True):
        if not (0 <= a <= b <= s) or c < 1:
            raise ShapeError(f"shrink: range {a}:{b}:{c} is invalid for an axis of size {s} in shape {x.shape}")
    if all(a == 0 and b == s and c == 1 for (a, b, c), s in zip(box, x.shape, strict=True)):
        return x
    shape = tuple(max(0, -(-(b - a) // c)) for a, b, c in box)
    return Node("shrink", (x,), box, shape, x.dtype, x.device)


def flip(x: Node, axes: tuple[int, ...]) -> Node:
    axes = tuple(sorted(set(int(a) for a in axes)))
    if not axes:
        return x
    return Node("flip", (x,), axes, x.shape, x.dtype, x.device)


def cat(xs: list[Node], axis: int) -> Node:
    if len(xs) == 1:
        return xs[0]
    first = xs[0]
    for x in xs[1:]:
        if len(x.shape) != len(first.shape) or any(
            a != b for i, (a, b) in enumerate(zip(x.shape, first.shape, strict=True)) if i != axis
        ):
            raise ShapeError(f"cat: shapes {[x.shape for x in xs]} differ outside axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return Node("cat", tuple(xs), axis, tuple(shape), first.dtype, first.device)


def sum_to(g: Node, shape: tuple[int, ...]) -> Node:
    """Reduce a gradient of an expanded value back to the pre-expansion shape (same rank)."""
    from plait.graph.ops.reduce import reduce

    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape, strict=True)) if a != b)
    return reduce("sum", g, axes) if axes else g


def _shrink_grad(n: Node, g: Node) -> tuple[Node]:
    x = n.srcs[0]
    for axis, ((start, _stop, step), size) in enumerate(zip(n.arg, x.shape, strict=True)):
        if step > 1:
            shp = g.shape
            g = reshape(g, (*shp[: axis + 1], 1, *shp[axis + 1 :]))
            pads = [(0, 0)] * len(g.shape)
            pads[axis + 1] = (0, step - 1)
            g = pad(g, tuple(pads))
            g = reshape(g, (*shp[:axis], shp[axis] * step, *shp[axis + 1 :]))
            box = [(0, s, 1) for s in g.shape]
            keep = min(g.shape[axis], size - start)
            box[axis] = (0, keep, 1)
            g = shrink(g, tuple(box))
        pads = [(0, 0)] * len(g.shape)
        pads[axis] = (start, size - start - g.shape[axis])
        g = pad(g, tuple(pads))
    return (g,)


def _pad_grad(n: Node, g: Node) -> tuple[Node]:
    pads = n.arg[0]
    return (shrink(g, tuple((a, a + s, 1) for (a, _), s in zip(pads, n.srcs[0].shape, strict=True))),)


def _cat_grad(n: Node, g: Node) -> tuple[Node, ...]:
    out, offset = [], 0
    for x in n.srcs:
        box = [(0, s, 1) for s in g.shape]
        box[n.arg] = (offset, offset + x.shape[n.arg], 1)
        out.append(shrink(g, tuple(box)))
        offset += x.shape[n.arg]
    return tuple(out)


def _permute_grad(n: Node, g: Node) -> tuple[Node]:
    inv = [0] * len(n.arg)
    for i, p in enumerate(n.arg):
        inv[p] = i
    return (permute(g, tuple(inv)),)


register(OpDef("reshape", "movement", lambda n, g: (reshape(g, n.srcs[0].shape),)))
register(OpDef("permute", "movement", _permute_grad))
register(OpDef("expand", "movement", lambda n, g: (sum_to(g, n.srcs[0].shape),)))
register(OpDef("pad", "movement", _pad_grad))
register(OpDef("shrink", "movement", _shrink_grad))
register(OpDef("flip", "movement", lambda n, g: (flip(g, n.arg),)))
register(OpDef("cat", "movement", _cat_grad))
