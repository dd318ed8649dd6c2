"""Reverse-mode autodiff on the graph: each op's vjp (defined beside the op) builds gradient nodes, so the
whole backward pass is itself a lazy graph that compiles into fused kernels like any other."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from plait.errors import UnsupportedError
from plait.graph.node import GRAD_MODE, Node, toposort
from plait.graph.ops import OPS
from plait.graph.ops.elementwise import add, cast


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


def gradients(root: Node, seed: Node, wrt: list[Node]) -> dict[int, Node]:
    """d(root)/d(node) for every node in `wrt` reachable from root (as lazy nodes), given d(loss)/d(root)=seed."""
    targets = {n.uid for n in wrt}
    order = [n for n in toposort([root], through_realized=True) if n.rg]
    grads: dict[int, Node] = {root.uid: seed}
    out: dict[int, Node] = {}
    with no_grad():
        for node in reversed(order):
            g = grads.pop(node.uid, None)
            if g is None:
                continue
            if node.uid in targets:
                out[node.uid] = g
            if not node.srcs:
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
                prev = grads.get(src.uid)
                grads[src.uid] = gs if prev is None else add(prev, gs)
    return out
