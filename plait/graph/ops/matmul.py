"""Batched matrix product: (..., m, k) @ (..., k, n) with equal batch dims; lowered to the GEMM template."""

from __future__ import annotations

from plait.errors import DTypeError, ShapeError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.movement import permute


def matmul(a: Node, b: Node) -> Node:
    if len(a.shape) < 2 or len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: shapes {a.shape} and {b.shape} do not chain ((..., m, k) @ (..., k, n))")
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul: dtypes {a.dtype.name} and {b.dtype.name} differ (cast one first)")
    return Node("matmul", (a, b), None, a.shape[:-1] + b.shape[-1:], a.dtype, a.device)


def transpose_last(x: Node) -> Node:
    n = len(x.shape)
    return permute(x, (*tuple(range(n - 2)), n - 1, n - 2))


def _matmul_grad(n: Node, g: Node) -> tuple[Node, Node]:
    a, b = n.srcs
    return matmul(g, transpose_last(b)), matmul(transpose_last(a), g)


register(OpDef("matmul", "matmul", _matmul_grad))
