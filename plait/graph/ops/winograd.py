"""The Winograd weight transform: a node the scheduler adds in front of a convolution it runs with Winograd's
algorithm (cpu device, plait/codegen/winograd_c.py). It never appears in a user's graph, so it has no gradient."""

from __future__ import annotations

from typing import Any

from plait.codegen import winograd_c
from plait.codegen.cstyle import RenderedKernel
from plait.errors import UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


def winograd_weight(weight: Node, plan: winograd_c.WinogradPlan) -> Node:
    """U = G w G^T per (output, input) channel pair of the convolution weight root `weight`, laid out (alpha^2, K
    rounded up to the register tile, C): the A operands of the Winograd products."""
    return Node("winograd_weight", (weight,), plan, plan.u_shape, weight.dtype, weight.device)


def _kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    if r.dialect != "c":
        raise UnsupportedError(f"winograd_weight {out.shape}: only the cpu device runs Winograd convolutions")
    return winograd_c.render_weight(out.arg)


register(OpDef("winograd_weight", "custom", kernel=_kernel))
