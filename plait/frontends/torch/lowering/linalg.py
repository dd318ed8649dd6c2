"""Matrix products: mm, bmm, addmm, matmul (plait's GEMM path)."""

from __future__ import annotations

from typing import Any

from plait.frontends.native.tensor import Tensor
from plait.frontends.torch.lowering import aten, register


@register(aten.mm.default, aten.bmm.default, aten.matmul.default)
def mm(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


@register(aten.addmm.default)
def addmm(bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    prod = a @ b
    if alpha != 1:
        prod = prod * alpha
    return prod + (bias if beta == 1 else bias * beta) if beta != 0 else prod


@register(aten.baddbmm.default)
def baddbmm(bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return addmm(bias, a, b, beta=beta, alpha=alpha)
