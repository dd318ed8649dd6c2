"""Reverse-mode autodiff on the graph: each op's vjp (defined beside the op) builds gradient nodes, so the
whole backward pass is itself a lazy graph that compiles into fused kernels like any other."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator

from plait.errors import UnsupportedError
from plait.graph.node import GRAD_MODE, Node, toposort
from plait.graph.ops import OPS
from plait.graph.ops.elementwise import add, cast, const
from plait.graph.ops.movement import cat


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Record no history inside the block (optimizer steps, evaluation)."""
    saved = GRAD_MODE[0]
    GRAD_MODE[0] = False
    try:
        yield
    finally:
        GRAD_MODE[0] = saved


def grad_enabled() -> bool:
    return GRAD_MODE[0]


# d(loss)/d(out) -> [(ancestor of out, its gradient contribution)]
Rule = Callable[[Node], list[tuple[Node, Node]]]
_RULES: weakref.WeakKeyDictionary[Node, Rule] = weakref.WeakKeyDictionary()


def custom_vjp(out: Node, rule: Rule) -> None:
    """Differentiate `out` with `rule` instead of through the ops that built it: backward hands the rule out's
    gradient and adds the contributions it returns to the named ancestors (typically the inputs of a composite
    such as a convolution, whose op-by-op gradient would take a slower route). The ops between those ancestors and
    `out` must have no other reader that needs a gradient, since they receive none. Only built while recording."""
    if out.rg:
        _RULES[out] = rule


def gradients(root: Node, seed: Node, wrt: list[Node]) -> dict[int, Node]:
    """d(root)/d(node) for every node in `wrt` reachable from root (as lazy nodes), given d(loss)/d(root)=seed."""
    targets = {n.uid for n in wrt}
    order = [n for n in toposort([root], through_realized=True) if n.rg]
    parts: dict[int, list[Node]] = {root.uid: [seed]}  # each node's gradient contributions, summed when it is reached
    out: dict[int, Node] = {}
    with no_grad():
        for node in reversed(order):
            contributions = parts.pop(node.uid, None)
            if contributions is None:
                continue
            g = accumulate(contributions)
            if node.uid in targets:
                out[node.uid] = g
            if not node.srcs:
                continue
            rule = _RULES.get(node)
            if rule is not None:
                for anc, contrib in rule(g):
                    if anc.rg:
                        c = contrib if contrib.dtype == anc.dtype else cast(contrib, anc.dtype)
                        parts.setdefault(anc.uid, []).append(c)
                continue
            vjp = OPS[node.op].vjp
            if vjp is None:
                if any(s.rg and s.dtype.is_float for s in node.srcs):
                    raise UnsupportedError(f"backward: op {node.op} {node.shape} has no gradient; detach its input")
                continue
            for src, gs in zip(node.srcs, vjp(node, g), strict=True):
                if gs is None or not src.rg:
                    continue
                if gs.dtype != src.dtype:
                    gs = cast(gs, src.dtype)
                parts.setdefault(src.uid, []).append(gs)
    return out


def _slab(node: Node) -> tuple[int, int] | None:
    """(axis, start) when `node` zero-pads its source along exactly one axis (the gradient of a slice), else None."""
    if node.op != "pad" or node.realized or node.arg[1] != 0:
        return None
    padded = [i for i, (a, b) in enumerate(node.arg[0]) if a or b]
    return (padded[0], node.arg[0][padded[0]][0]) if len(padded) == 1 else None


def accumulate(contributions: list[Node]) -> Node:
    """The sum of one node's gradient contributions. Zero-padded slabs of disjoint ranges along one axis (the
    gradients of the slices an unrolled loop takes: an RNN's time steps, a fused matmul's gates) are joined with one
    cat, gaps filled with zeros: summed, every element would read every padded view (quadratic in the number of
    slices), joined, it reads the one slab that holds it."""
    if len(contributions) == 1:
        return contributions[0]
    rest: list[Node] = []
    slabs: dict[int, list[tuple[int, Node]]] = {}
    for c in contributions:
        where = _slab(c)
        if where is None:
            rest.append(c)
        else:
            slabs.setdefault(where[0], []).append((where[1], c))
    for axis, group in slabs.items():
        if len(group) == 1:
            rest.append(group[0][1])
            continue
        group.sort(key=lambda t: t[0])
        like = group[0][1]
        pieces: list[Node] = []
        end = 0
        for start, c in group:
            src = c.srcs[0]
            if not src.shape[axis]:  # an empty slice contributes nothing
                continue
            if start < end:  # overlaps a slab already placed: summed separately
                rest.append(c)
                continue
            if start > end:
                pieces.append(const(0, _with(like.shape, axis, start - end), like.dtype, like.device))
            pieces.append(src)
            end = start + src.shape[axis]
        if end < like.shape[axis]:
            pieces.append(const(0, _with(like.shape, axis, like.shape[axis] - end), like.dtype, like.device))
        rest.append(cat(pieces, axis))
    total = rest[0]
    for c in rest[1:]:
        total = add(total, c)
    return total


def _with(shape: tuple[int, ...], axis: int, size: int) -> tuple[int, ...]:
    return (*shape[:axis], size, *shape[axis + 1 :])
