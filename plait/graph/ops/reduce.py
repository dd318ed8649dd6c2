"""Reductions over axes: sum, max, min, prod (keepdims shape), and argmax/argmin over one axis."""

from __future__ import annotations

from plait import dtypes
from plait.errors import ShapeError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.elementwise import binary, cast, const, div, mul, where, zeros_like
from plait.graph.ops.movement import expand

REDUCE_OPS = ("sum", "max", "min", "prod")


def reduce(op: str, x: Node, axes: tuple[int, ...]) -> Node:
    """Reduce `axes` of x, keeping them as size-1 axes (the frontend reshapes when keepdims is False)."""
    axes = tuple(sorted(set(axes)))
    if any(a < 0 or a >= len(x.shape) for a in axes):
        raise ShapeError(f"{op}: axes {axes} out of range for shape {x.shape}")
    if op in ("max", "min") and any(x.shape[a] == 0 for a in axes):
        raise ShapeError(f"{op}: cannot reduce an empty axis of shape {x.shape} (it has no identity)")
    shape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    if not axes:
        return x
    return Node(f"r{op}", (x,), axes, shape, x.dtype, x.device)


def arg_reduce(op: str, x: Node, axis: int) -> Node:
    """Index of the first max (argmax) or min (argmin) along `axis`, as int64, keepdims shape."""
    if not 0 <= axis < len(x.shape) or x.shape[axis] == 0:
        raise ShapeError(f"{op}: axis {axis} invalid or empty for shape {x.shape}")
    shape = tuple(1 if i == axis else s for i, s in enumerate(x.shape))
    return Node(op, (x,), (axis,), shape, dtypes.int64, x.device)


def _sum_grad(n: Node, g: Node) -> tuple[Node]:
    return (expand(g, n.srcs[0].shape),)


def _minmax_grad(n: Node, g: Node) -> tuple[Node]:
    x = n.srcs[0]
    hit = cast(binary("cmpeq", x, expand(n, x.shape)), x.dtype)
    count = reduce("sum", hit, n.arg)
    return (mul(expand(div(g, count), x.shape), hit),)


def _prod_grad(n: Node, g: Node) -> tuple[Node]:
    x = n.srcs[0]
    nz = binary("cmpne", x, zeros_like(x))
    safe = where(nz, x, const(1, x.shape, x.dtype, x.device))
    # exact where no element of the reduced slice is zero; a slice holding a zero gets zero gradient
    return (where(nz, div(mul(expand(g, x.shape), expand(n, x.shape)), safe), zeros_like(x)),)


register(OpDef("rsum", "reduce", _sum_grad))
register(OpDef("rmax", "reduce", _minmax_grad))
register(OpDef("rmin", "reduce", _minmax_grad))
register(OpDef("rprod", "reduce", _prod_grad))
register(OpDef("argmax", "reduce"))
register(OpDef("argmin", "reduce"))
register(OpDef("rsplit", "reduce"))  # a partial reduction made by the scheduler; never built by users
