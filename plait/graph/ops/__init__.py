"""The op table. Each op family module defines its ops once (constructor, shape/dtype rule, gradient, lowering)
and registers them here explicitly with `register`.

Kinds: leaf (buffer, input, const), elementwise, movement, reduce, matmul, contract, custom (an op that renders
its own whole kernel per dialect; its sources are realized first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plait.graph.node import Node

Vjp = Callable[[Node, Node], tuple["Node | None", ...]]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: str
    vjp: Vjp | None = None
    render: Callable[..., str] | None = None
    cost: int = 1
    kernel: Callable[..., Any] | None = None  # kind "custom": (renderer, out, inputs) -> RenderedKernel


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in OPS:
        raise ValueError(f"op {op.name} registered twice")
    OPS[op.name] = op
    return op


def kind(node: Node) -> str:
    return "leaf" if node.realized else OPS[node.op].kind


def _load_families() -> None:
    from plait.graph.ops import (  # noqa: F401
        conv,
        depthwise_cl,
        elementwise,
        matmul,
        movement,
        pointwise_weight,
        reduce,
        winograd,
        winograd_cl,
    )


_load_families()
