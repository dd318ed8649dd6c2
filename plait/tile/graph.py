"""The `tile` graph op: one node per contraction, its Spec in `node.arg`, registered once in the op table.

Its gradient is derived, not written per op: for each read X[f(r)] in `O[g(r)] agg= E`, dX is the contraction
`dX[f(r)] += dO[g(r)] * w(r) * dE/dX[f(r)]` over the same indices and constraints, where w is 1 for sum,
[E == O] / (number of such elements) for max and min (the gradient goes to the selected element), and O / E for
product. The kernel lowering turns the affine output indices f(r) back into loops (see kernel.normalize).
"""

from __future__ import annotations

from typing import Any

from plait import dtypes
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.elementwise import add, zeros_like
from plait.tile.kernel import render_kernel
from plait.tile.spec import Aff, Constraint, Spec, derivative, leaves, mk


def make_node(
    name: str,
    out_name: str,
    out_shape: tuple[int, ...],
    agg: str,
    out_idx: tuple[Aff, ...],
    ranges: tuple[tuple[str, int, int], ...],
    constraints: tuple[Constraint, ...],
    expr: tuple[Any, ...],
    names: dict[int, str],
    dtype: dtypes.DType,
) -> Node:
    """A tile node for `expr` whose reads name their operand by Node; operands are numbered by first use."""
    order: list[Node] = []
    for lf in leaves(expr):
        if all(n is not lf[1] for n in order):
            order.append(lf[1])
    pos = {id(n): i for i, n in enumerate(order)}
    keyed = _rekey(expr, pos)
    spec = Spec(
        name,
        out_name,
        tuple(out_shape),
        agg,
        tuple(out_idx),
        tuple(ranges),
        tuple(dict.fromkeys(constraints)),
        keyed,
        tuple(names.get(n.uid, f"x{i}") for i, n in enumerate(order)),
        tuple(n.shape for n in order),
    )
    device = order[0].device if order else "cpu"
    return Node("tile", tuple(order), spec, tuple(out_shape), dtype, device)


def _rekey(e: tuple[Any, ...], pos: dict[int, int]) -> tuple[Any, ...]:
    if e[0] == "acc":
        return ("acc", pos[id(e[1])], e[2], e[3])
    if e[0] == "const":
        return e
    return (e[0], *(_rekey(c, pos) for c in e[1:]))


def _to_nodes(e: tuple[Any, ...], srcs: tuple[Node, ...]) -> tuple[Any, ...]:
    if e[0] == "acc":
        return ("acc", srcs[e[1]], e[2], e[3])
    if e[0] == "const":
        return e
    return (e[0], *(_to_nodes(c, srcs) for c in e[1:]))


def _exclusions(spec: Spec) -> tuple[Constraint, ...]:
    """A read outside an unpadded operand skipped its term; the gradient must skip the same terms."""
    out = []
    for lf in leaves(spec.expr):
        if lf[3] is None:
            for a, s in zip(lf[2], spec.shapes[lf[1]]):
                if a.terms:
                    out.append(Constraint.make(a, 0, s))
    return tuple(out)


def _vjp(n: Node, g: Node) -> tuple[Node | None, ...]:
    spec: Spec = n.arg
    e = _to_nodes(spec.expr, n.srcs)
    names = {s.uid: nm for s, nm in zip(n.srcs, spec.names)}
    names[n.uid] = spec.out_name
    names[g.uid] = f"d{spec.out_name}"
    constraints = spec.constraints + _exclusions(spec)
    g_read = ("acc", g, spec.out_idx, None)
    o_read = ("acc", n, spec.out_idx, None)
    weight: tuple[Any, ...] | None = g_read
    if spec.agg in ("max", "min"):
        hit = ("eq", e, o_read)
        count = make_node(
            f"{spec.name}_count",
            "count",
            spec.out_shape,
            "sum",
            spec.out_idx,
            spec.ranges,
            constraints,
            hit,
            names,
            n.dtype,
        )
        names[count.uid] = "count"
        weight = ("div", ("mul", g_read, hit), ("acc", count, spec.out_idx, None))
    elif spec.agg == "prod":
        weight = ("div", ("mul", g_read, o_read), e)
    grads: list[Node | None] = []
    for p, src in enumerate(n.srcs):
        if not src.dtype.is_float:
            grads.append(None)
            continue
        total: Node | None = None
        for lf in leaves(e):
            if lf[1] is not src:
                continue
            de = derivative(e, lf)
            if de is None:
                continue
            ge = mk("mul", weight, de)
            assert ge is not None
            part = make_node(
                f"{spec.name}_grad_{spec.names[p]}",
                f"d{spec.names[p]}",
                src.shape,
                "sum",
                lf[2],
                spec.ranges,
                constraints,
                ge,
                names,
                src.dtype,
            )
            total = part if total is None else add(total, part)
        grads.append(total if total is not None else zeros_like(src))
    return tuple(grads)


register(OpDef("tile", "contract", vjp=_vjp, kernel=render_kernel))
