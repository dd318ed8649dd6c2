"""Backward ATen ops lowered through plait's own autodiff: the gradient of the forward lowering, evaluated lazily.

`convolution_backward(g, x, w, ...)` is the vector-Jacobian product of plait's conv2d at (x, w) with cotangent g, so
the forward lowering is the single source of truth and the backward graph fuses like any other plait graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plait.frontends.native.tensor import Tensor
from plait.graph import autodiff
from plait.graph.node import GRAD_MODE, Node


def _leaf(t: Tensor) -> Tensor:
    """An identity view of t that autodiff treats as a variable (t itself may be a plan input or constant)."""
    # an identity permute: movement ops cost nothing, and unlike reshape chains they are not collapsed
    node = Node("permute", (t.node,), tuple(range(t.ndim)), t.shape, t.dtype, t.device)
    node.rg = True
    return Tensor(node)


def vjp(fn: Callable[..., Tensor], primals: Sequence[Tensor], cotangent: Tensor) -> list[Tensor | None]:
    """d<fn(*primals), cotangent>/d(primal) for each primal (None where fn does not depend on it)."""
    saved = GRAD_MODE[0]
    GRAD_MODE[0] = True
    try:
        leaves = [_leaf(p) for p in primals]
        out = fn(*leaves)
    finally:
        GRAD_MODE[0] = saved
    grads = autodiff.gradients(out.node, cotangent.astype(out.dtype).node, [leaf.node for leaf in leaves])
    return [Tensor(grads[leaf.node.uid]) if leaf.node.uid in grads else None for leaf in leaves]


def vjp1(fn: Callable[[Tensor], Tensor], primal: Tensor, cotangent: Tensor) -> Tensor:
    """The gradient with respect to a single primal (zeros when fn ignores it)."""
    g = vjp(fn, [primal], cotangent)[0]
    return g if g is not None else Tensor.full(primal.shape, 0, primal.dtype, primal.device)
