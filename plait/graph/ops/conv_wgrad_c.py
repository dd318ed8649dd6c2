"""The weight gradient of a (non-grouped) convolution as one op with a C kernel of its own on the cpu device.

dW[co, c, ky, kx] = sum over images and output positions of dy[n, co, oy, ox] * x[n, c, oy*sh - ph + ky*dh,
ox*sw - pw + kx*dw]. The kernel (plait/codegen/wgrad_c.py) reads dy in place and gathers the patch rows of x while
packing, so the folded form's patch columns (C*kh*kw x N*OH*OW, an im2col buffer of 9-49 times the input's patch
taps) and the copy of dy into an (N*P, Co) layout are not made; with no other reader of the columns, the training
forward then gathers its patches from the image as at inference. `plait.nn.functional.conv2d` uses it on the cpu
(float32); OpenCL gathers the folded columns inside its GEMM instead (`scheduler._implicit_wgrad`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from plait import dtypes
from plait.codegen import wgrad_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.conv import Window

# Output positions per image (and in all) from which the kernel is used. Each weight-gradient entry ends in a sum
# over vector lanes and each patch row is gathered in runs of one output row, which long position runs amortise; on
# fewer the folded GEMM (outer products over its patch columns) is faster. One thread, resnet18's layers at batch 16
# (benchmarks/conv_wgrad_direct_cpu.py, with the im2col and dy's copy the folded form needs): 56x56 51 against
# 69 ms, 28x28 48 against 62, 14x14 69-76 against 64-70, 7x7 96-120 against 67-71.
MIN_PLANE, MIN_POSITIONS = 784, 8192
# Stride-1 windows take the kernel's padded form (plait_wgrad_s1, no gather per chunk of patch rows) from this many
# output positions per image, whatever the batch: the training forward then runs per image too, which it does from
# the same size on (nn.functional.PER_IMAGE_MIN_POSITIONS). One thread, process CPU time, against the folded form with
# its im2col: resnet18 b16's 14x14 layer 50 against 54 ms, cifar_cnn b16's 16x16 layers 2.4-4.1 against 3.0-4.8, a
# 12x12 one 1.1 against 2.2, b2 of the 14x14 layer 11.1 against 11.6; on 7x7 planes (9 padded columns for 7) the
# folded GEMM stays faster, 51 against 61 ms.
S1_MIN_PLANE = 128


def supports(x: Node, win: Window) -> bool:
    """Whether the kernel takes this convolution: float32 on the cpu, a patch gather (not a 1x1 stride-1 window,
    whose columns are x itself and cost no im2col), 32-bit offsets."""
    pointwise = (win.kh, win.kw, win.sh, win.sw, win.ph, win.pw) == (1, 1, 1, 1, 0, 0)
    return (
        x.dtype == dtypes.float32
        and x.device.startswith("cpu")
        and not pointwise
        and win.n * win.c * win.h * win.w < 2**31
        and win.n * win.oh * win.ow < 2**31
    )


def wins(win: Window) -> bool:
    """Whether the kernel is faster than the folded GEMM here: a stride-1 window with output planes of S1_MIN_PLANE
    positions or more, else output planes of MIN_PLANE positions or more and MIN_POSITIONS over the batch."""
    if wgrad_c.shifted(win):
        return win.oh * win.ow >= S1_MIN_PLANE
    return win.oh * win.ow >= MIN_PLANE and win.n * win.oh * win.ow >= MIN_POSITIONS


def conv_wgrad_c(dy: Node, x: Node, win: Window) -> Node:
    """The weight gradient (Co, C, kh, kw) of a convolution of `x` (N, C, H, W) over `win` whose output gradient is
    `dy` (N, Co, OH, OW)."""
    if (
        len(dy.shape) != 4
        or (dy.shape[0], *dy.shape[2:]) != (win.n, win.oh, win.ow)
        or x.shape != (win.n, win.c, win.h, win.w)
    ):
        raise ShapeError(f"conv_wgrad_c: output gradient {dy.shape} and input {x.shape} do not match the window {win}")
    if not (supports(x, win) and supports(dy, win)):
        raise UnsupportedError(
            f"conv_wgrad_c {x.shape} -> {dy.shape}: float32 on the cpu device, a window other than 1x1 stride 1 "
            f"(got {x.dtype.name} on {x.device}); plait.nn.functional takes the column form elsewhere"
        )
    return Node("conv_wgrad_c", (dy, x), win, (dy.shape[1], win.c, win.kh, win.kw), dy.dtype, dy.device)


def _kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    win: Window = out.arg
    if r.dialect != "c":
        raise UnsupportedError(f"conv_wgrad_c {out.shape}: this kernel runs on the cpu device only")
    params = [r.param(out.dtype, "b0", True), *(r.param(t.dtype, f"b{i + 1}", False) for i, t in enumerate(inputs))]
    body = wgrad_c.call(win, out.shape[0])
    src = entry_points("KERNEL_NAME", params, body, f"{wgrad_c.library()}/* KERNEL_NAME */\n")
    digest = hashlib.sha256(src.encode()).hexdigest()[:10]
    rows, k = win.c * win.kh * win.kw, win.n * win.oh * win.ow
    name = f"WGRAD_{out.shape[0]}x{rows}x{k}_{digest}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), (1,), None)


def _no_grad(node: Node, g: Node) -> tuple[Node | None, ...]:
    raise UnsupportedError(f"conv_wgrad_c {node.shape}: a weight gradient has no gradient here (no double backward)")


register(OpDef("conv_wgrad_c", "custom", _no_grad, kernel=_kernel))
