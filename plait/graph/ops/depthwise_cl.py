"""Direct depthwise-convolution gradients for OpenCL devices, made by `nn.functional`'s convolution gradient.

A depthwise convolution (one filter per channel) went through patch columns in training: an im2col of the input
(nine times its size for 3x3) kept for the weight gradient, a batched one-row product per image and channel summed
over the batch, and for strides above one a product plus col2im for the input gradient. On an H100 those were 13.9
ms of mobilenet_v2's 42 ms of kernels at batch 64. Here:

- `depthwise_wgrad_cl`: dw[c, ky, kx] = sum over (n, oy, ox) of dy[n, c, oy, ox] * x[n, c, iy, ix], one
  work-group per (channel, part) reading the output gradient once and the input window from cache, every tap
  summed in registers, then a tree in local memory; the parts are summed by a short reduction.
- `depthwise_dgrad_cl`: dx[n, c, iy, ix] gathers the taps whose output position reads it (col2im fused with the
  product), for strided convolutions; a stride-1 input gradient is already a direct depthwise convolution of dy.

Neither appears in a user's graph (no gradient of their own), and they render for OpenCL only: on the cpu the
column form measured faster (docs/benchmarks.md, the revert in "cpu training step: convolution gradients").
"""

from __future__ import annotations

from typing import Any

from plait.codegen.cstyle import RenderedKernel
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.conv import Window, covering_taps
from plait.graph.ops.reduce import reduce

GROUP = 256  # work-items per weight-gradient work-group
GROUPS_TARGET = 1056  # work-groups the weight gradient aims for (8 per SM of an H100, as the reductions' split)
MIN_PER_ITEM = 4  # fewest output positions each work-item of a part sums
MAX_TAPS = 25  # taps per filter (5x5) whose partial sums fit local memory (25 x 256 floats = 25 KB)


def supports(win: Window) -> bool:
    """True when the direct kernels take this window (up to MAX_TAPS taps per filter)."""
    return win.kh * win.kw <= MAX_TAPS and not win.fold


def _check(op: str, dy: Node, win: Window) -> None:
    want = (win.n, win.c, win.oh, win.ow)
    if dy.shape != want:
        raise ShapeError(f"{op}: output gradient of shape {dy.shape} does not match the window {win} (want {want})")
    if not supports(win):
        raise UnsupportedError(f"{op}: {win.kh}x{win.kw} filters exceed {MAX_TAPS} taps; use the column form")


def depthwise_wgrad_cl(dy: Node, x: Node, win: Window) -> Node:
    """The weight gradient (C, 1, kh, kw) of a depthwise convolution of `x` (N, C, H, W) with output gradient `dy`
    (N, C, OH, OW): per-part sums from one kernel, then their sum when there is more than one part."""
    _check("depthwise_wgrad_cl", dy, win)
    if x.shape != (win.n, win.c, win.h, win.w):
        raise ShapeError(f"depthwise_wgrad_cl: input of shape {x.shape} does not match the window {win}")
    positions = win.n * win.oh * win.ow
    parts = max(1, min(-(-GROUPS_TARGET // win.c), positions // (GROUP * MIN_PER_ITEM)))
    kk = win.kh * win.kw
    part = Node("depthwise_wgrad_cl", (dy, x), (win, parts), (parts, win.c, kk), dy.dtype, dy.device)
    whole = reduce("sum", part, (0,)) if parts > 1 else part
    return Node("reshape", (whole,), (win.c, 1, win.kh, win.kw), (win.c, 1, win.kh, win.kw), dy.dtype, dy.device)


def depthwise_dgrad_cl(dy: Node, weight: Node, win: Window) -> Node:
    """The input gradient (N, C, H, W) of a depthwise convolution with filters `weight` (C, 1, kh, kw) and output
    gradient `dy` (N, C, OH, OW)."""
    _check("depthwise_dgrad_cl", dy, win)
    if weight.shape != (win.c, 1, win.kh, win.kw):
        raise ShapeError(f"depthwise_dgrad_cl: weight of shape {weight.shape} does not match the window {win}")
    return Node("depthwise_dgrad_cl", (dy, weight), win, (win.n, win.c, win.h, win.w), dy.dtype, dy.device)


def _only_opencl(r: Any, out: Node) -> None:
    if r.dialect != "opencl":
        raise UnsupportedError(f"{out.op} {out.shape}: rendered for OpenCL devices only; the cpu uses patch columns")


def _wgrad_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    """Work-group w = part * C + c; its work-items take output positions part * GROUP + lid, stepping parts *
    GROUP (a warp reads consecutive positions of one channel plane), each summing every tap in registers."""
    _only_opencl(r, out)
    win, parts = out.arg
    dy, x = inputs
    ct, kk = r.compute_type(dy.dtype), win.kh * win.kw
    plane, total = win.oh * win.ow, win.n * win.oh * win.ow
    params = [r.param(out.dtype, "b0", True), r.param(dy.dtype, "b1", False), r.param(x.dtype, "b2", False)]
    qt = r.idx_type(total + parts * GROUP)
    taps = []
    for ky in range(win.kh):
        taps.append(f"  {{ int iy = iy0 + {ky * win.dh}; if (iy >= 0 && iy < {win.h}) {{")
        for kx in range(win.kw):
            ix = f"ix0 + {kx * win.dw}"
            v = r.load(x.dtype, "b2", f"xb + (long)iy * {win.w} + {ix}")
            taps.append(f"    if ({ix} >= 0 && {ix} < {win.w}) a{ky * win.kw + kx} += g * {v};")
        taps.append("  } }")
    lines = [
        "int w = get_group_id(0), l = get_local_id(0);",
        f"int c = w % {win.c}, part = w / {win.c};",
        *(f"{ct} a{t} = 0;" for t in range(kk)),
        f"for ({qt} q = ({qt})part * {GROUP} + l; q < {total}; q += {parts * GROUP}) {{",
        f"  int n = q / {plane}, p = q % {plane};",
        f"  long nc = (long)n * {win.c} + c;",
        f"  {ct} g = {r.load(dy.dtype, 'b1', f'nc * {plane} + p')};",
        f"  long xb = nc * {win.h * win.w};",
        f"  int iy0 = (p / {win.ow}) * {win.sh} - {win.ph}, ix0 = (p % {win.ow}) * {win.sw} - {win.pw};",
        *taps,
        "}",
        f"__local {ct} sh[{kk * GROUP}];",
        *(f"sh[{t * GROUP} + l] = a{t};" for t in range(kk)),
        r.barrier,
        f"for (int s = {GROUP // 2}; s > 0; s >>= 1) {{",
        f"  if (l < s) for (int t = 0; t < {kk}; t++) sh[t * {GROUP} + l] += sh[t * {GROUP} + l + s];",
        f"  {r.barrier}",
        "}",
        f"if (l < {kk}) " + r.store(out.dtype, "b0", f"(long)w * {kk} + l", f"sh[l * {GROUP}]"),
    ]
    return r._finish("DWWGRAD", out, params, lines, (parts * win.c * GROUP,), (GROUP,))


def _dgrad_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    """One work-item per input pixel, adding the taps of the output positions that read it in (ky, kx) order."""
    _only_opencl(r, out)
    win: Window = out.arg
    dy, weight = inputs
    ct, kk = r.compute_type(dy.dtype), win.kh * win.kw
    params = [r.param(out.dtype, "b0", True), r.param(dy.dtype, "b1", False), r.param(weight.dtype, "b2", False)]
    body = [
        f"int ix = gid % {win.w}, iy = (gid / {win.w}) % {win.h}; long nc = gid / {win.h * win.w};",
        f"int c = nc % {win.c};",
        f"long ob = nc * {win.oh * win.ow};",
        f"{ct} acc = 0;",
        *covering_taps(
            win,
            [
                f"acc += {r.load(weight.dtype, 'b2', f'c * {kk} + ky * {win.kw} + kx')} * "
                f"{r.load(dy.dtype, 'b1', f'ob + oy * {win.ow} + ox')};"
            ],
        ),
        r.store(out.dtype, "b0", "gid", "acc"),
    ]
    lines, gs, ls = r.parallel_for("gid", out.size, body, r.idx_type(out.size), out.size * kk)
    return r._finish("DWDGRAD", out, params, lines, gs, ls)


register(OpDef("depthwise_wgrad_cl", "custom", kernel=_wgrad_kernel))
register(OpDef("depthwise_dgrad_cl", "custom", kernel=_dgrad_kernel))
