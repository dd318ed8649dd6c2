"""The packed weights of a 1x1 convolution run across the vector lanes: a node the scheduler adds in front of such a
product on the cpu device when the weight is a constant of the plan (plait/codegen/pointwise_c.py). The packing runs
once, when the plan is built. It never appears in a user's graph, so it has no gradient."""

from __future__ import annotations

import hashlib
from typing import Any

from plait.codegen import pointwise_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.errors import UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


def pointwise_weight(weight: Node, plan: pointwise_c.LanesPlan) -> Node:
    """The weight root `weight` (m x k through the plan's view) packed as panels of 16*nv output channels."""
    return Node("pointwise_weight", (weight,), plan, (plan.packed_size,), weight.dtype, weight.device)


def _kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    if r.dialect != "c":
        raise UnsupportedError(f"pointwise_weight {out.shape}: only the cpu device packs 1x1 weights across the lanes")
    stem, body = pointwise_c.render_pack(out.arg)
    src = entry_points("KERNEL_NAME", ["float* restrict U", "const float* restrict W"], body)
    name = f"{stem}_{hashlib.sha256(src.encode()).hexdigest()[:10]}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), (1,), None)


register(OpDef("pointwise_weight", "custom", kernel=_kernel))
