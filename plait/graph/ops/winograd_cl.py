"""The OpenCL Winograd transforms in front of the batched GEMM: nodes the scheduler adds when it runs a convolution
with Winograd's F(2,3) on an OpenCL device (plait/codegen/winograd_cl.py). They never appear in a user's graph, so
they have no gradient."""

from __future__ import annotations

from typing import Any

from plait.codegen import winograd_cl
from plait.codegen.cstyle import RenderedKernel
from plait.errors import UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


def winograd_cl_weight(weight: Node, plan: winograd_cl.WinogradCLPlan) -> Node:
    """U = G w G^T per (output, input) channel pair of the weight root `weight`, laid out (16, K, C)."""
    return Node("winograd_cl_weight", (weight,), plan, plan.u_shape, weight.dtype, weight.device)


def winograd_cl_input(image: Node, plan: winograd_cl.WinogradCLPlan) -> Node:
    """V = B^T d B per 4x4 tile d of the image root `image`, laid out (16, C, tiles padded to 4)."""
    return Node("winograd_cl_input", (image,), plan, plan.v_shape, image.dtype, image.device)


def _only_opencl(r: Any, out: Node) -> None:
    if r.dialect != "opencl":
        raise UnsupportedError(f"{out.op} {out.shape}: this Winograd transform is rendered for OpenCL devices only")


def _weight_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    _only_opencl(r, out)
    return winograd_cl.render_weight(out.arg)


def _input_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    _only_opencl(r, out)
    return winograd_cl.render_input(out.arg)


register(OpDef("winograd_cl_weight", "custom", kernel=_weight_kernel))
register(OpDef("winograd_cl_input", "custom", kernel=_input_kernel))
