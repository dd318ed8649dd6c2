"""Packed weights: a node the scheduler adds on the cpu device in front of a product whose weight is a constant of the
plan, packed for a 1x1 convolution across the vector lanes (plait/codegen/pointwise_c.py), a stride-2 or stem
convolution's lanes tile, or the GEMM's register tile (gemm_c.APack). The packing runs once, when the plan is built.
It never appears in a user's graph, so it has no gradient."""

from __future__ import annotations

import hashlib
from typing import Any

from plait.codegen import gemm_c, pointwise_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.errors import UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


def pointwise_weight(weight: Node, plan: pointwise_c.LanesPlan | gemm_c.APack) -> Node:
    """The weight root `weight` (m x k through the plan's view) packed as panels of VW*nv output channels (a lanes
    plan), or of the GEMM register tile's rows (gemm_c.APack)."""
    return Node("pointwise_weight", (weight,), plan, (plan.packed_size,), weight.dtype, weight.device)


def _kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    if r.dialect != "c":
        raise UnsupportedError(f"pointwise_weight {out.shape}: only the cpu device packs weights at plan build")
    stem, body = out.arg.render_pack()
    src = entry_points("KERNEL_NAME", ["float* restrict U", "const float* restrict W"], body)
    name = f"{stem}_{hashlib.sha256(src.encode()).hexdigest()[:10]}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), (1,), None)


register(OpDef("pointwise_weight", "custom", kernel=_kernel))
