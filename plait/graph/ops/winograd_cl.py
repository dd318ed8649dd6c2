"""The OpenCL Winograd transforms around the batched GEMM (plait/codegen/winograd_cl.py): nodes the scheduler adds
when it runs a convolution with Winograd's F(2,3), F(2,5), F(4,3) or F(4,5) on an OpenCL device, and the weight
gradient of a training convolution that `nn.functional`'s convolution gradient builds with them
(`winograd_cl_wgrad`). They never appear in a user's graph, so they have no gradient."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from plait.codegen import winograd_cl
from plait.codegen.cstyle import RenderedKernel
from plait.codegen.winograd_cl import wgrad_plan
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.matmul import matmul
from plait.graph.ops.movement import permute, reshape

__all__ = ["wgrad_plan", "winograd_cl_input", "winograd_cl_weight", "winograd_cl_wgrad"]


def winograd_cl_weight(weight: Node, plan: winograd_cl.WinogradCLPlan) -> Node:
    """U = G w G^T per (output, input) channel pair of the weight root `weight`, laid out (alpha^2, K, C)."""
    return Node("winograd_cl_weight", (weight,), plan, plan.u_shape, weight.dtype, weight.device)


def winograd_cl_input(image: Node, plan: winograd_cl.WinogradCLPlan) -> Node:
    """V = B^T d B per alpha x alpha tile d of the image root `image`, laid out (alpha^2, C, padded tiles)."""
    return Node("winograd_cl_input", (image,), plan, plan.v_shape, image.dtype, image.device)


def winograd_cl_wgrad(dy: Node, x: Node, plan: winograd_cl.WinogradCLPlan) -> Node:
    """The (K, C, r, r) weight gradient of an r x r stride-1 convolution of `x` (N, C, H, W) with output gradient
    `dy` (N, K, OH, OW) by Winograd F(m,r) (`winograd_cl.wgrad_plan`; alpha = m + r - 1): the transforms of dy's
    m x m tiles D (alpha^2, K, T) and of x's alpha x alpha tiles V (alpha^2, C, T), the alpha^2 products
    D[xi] @ V[xi]^T as one batched GEMM in `plan.parts` K chunks (both operands read along the tiles in place), and
    the kernel that sums the chunks and transforms back."""
    p = plan
    if dy.shape != (p.n, p.k, p.oh, p.ow) or x.shape != (p.n, p.c, p.h, p.w):
        raise ShapeError(
            f"winograd_cl_wgrad: output gradient {dy.shape} and input {x.shape} do not match the plan's"
            f" {(p.n, p.k, p.oh, p.ow)} and {(p.n, p.c, p.h, p.w)}; make the plan from the convolution's window"
        )
    xis, parts, kc = p.xis, p.parts, p.tp // p.parts
    d = Node("winograd_cl_dy", (dy,), p, (xis, p.k, p.tp), dy.dtype, dy.device)
    v = winograd_cl_input(x, p)
    a = permute(reshape(d, (xis, p.k, parts, kc)), (0, 2, 1, 3))  # (16, parts, K, chunk)
    b = permute(reshape(v, (xis, p.c, parts, kc)), (0, 2, 3, 1))  # (16, parts, chunk, C)
    return Node("winograd_cl_wgrad", (matmul(a, b),), p, (p.k, p.c, p.r, p.r), dy.dtype, dy.device)


def _opencl_kernel(render: Callable[[winograd_cl.WinogradCLPlan], RenderedKernel]) -> Callable[..., RenderedKernel]:
    """A node's kernel rule: `render` of the node's plan, on OpenCL devices only (the transforms exist for no other
    dialect; the cpu has its own Winograd in plait/codegen/winograd_c.py)."""

    def kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
        if r.dialect != "opencl":
            raise UnsupportedError(f"{out.op} {out.shape}: this Winograd transform is rendered for OpenCL devices only")
        return render(out.arg)

    return kernel


register(OpDef("winograd_cl_weight", "custom", kernel=_opencl_kernel(winograd_cl.render_weight)))
register(OpDef("winograd_cl_input", "custom", kernel=_opencl_kernel(winograd_cl.render_input)))
register(OpDef("winograd_cl_dy", "custom", kernel=_opencl_kernel(winograd_cl.render_dy)))
register(OpDef("winograd_cl_wgrad", "custom", kernel=_opencl_kernel(winograd_cl.render_wgrad)))
