"""max_pool2d as one op with a kernel of its own on the cpu device (plait/codegen/pool_c.py).

plait.nn.functional and the ONNX importer build it for float32 inference on the cpu; elsewhere (other devices, other dtypes, a recorded
gradient) max pooling stays an elementwise chain over strided views, or im2col columns under autograd. The op
therefore has no gradient and no OpenCL kernel: asking for either is an error that says so.
"""

from __future__ import annotations

from typing import Any

from plait import dtypes
from plait.codegen import pool_c
from plait.codegen.cstyle import RenderedKernel
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register

PoolGeometry = pool_c.PoolGeometry


def supports(x: Node) -> bool:
    """Whether the pooling kernel takes the input `x` (float32 on the cpu device); the frontends keep their
    strided-view forms for anything else."""
    return x.dtype == dtypes.float32 and x.device.startswith("cpu")


def max_pool2d(x: Node, g: PoolGeometry) -> Node:
    """The (N, C, OH, OW) max pool of the float32 cpu input `x` over the windows `g` describes (pads are the ones
    before the first row and column; windows past the far edges are clipped to the image)."""
    if x.shape != (g.n, g.c, g.h, g.w):
        raise ShapeError(f"max_pool2d: input shape {x.shape} does not match the pooling geometry {g}")
    if not supports(x):
        raise UnsupportedError(
            f"max_pool2d kernel: float32 on the cpu device only (got {x.dtype.name} on {x.device}); "
            "plait.nn.functional.max_pool2d picks the strided-view form elsewhere"
        )
    return Node("max_pool2d", (x,), g, (g.n, g.c, g.oh, g.ow), x.dtype, x.device)


def _kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    if r.dialect != "c":
        raise UnsupportedError(f"max_pool2d {out.shape}: the dedicated pooling kernel runs on the cpu device only")
    params = [r.param(out.dtype, "b0", True), r.param(inputs[0].dtype, "b1", False)]
    lines, gs, ls = pool_c.render(r, out.arg)
    return r._finish("POOL", out, params, lines, gs, ls)


def _no_grad(node: Node, g: Node) -> tuple[Node | None, ...]:
    raise UnsupportedError(
        f"max_pool2d {node.shape}: the cpu inference kernel records no gradient; plait.nn.functional.max_pool2d "
        "builds a differentiable form when its input requires grad"
    )


register(OpDef("max_pool2d", "custom", _no_grad, kernel=_kernel))
