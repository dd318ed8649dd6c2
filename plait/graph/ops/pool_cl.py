"""Max pooling under autograd on OpenCL devices: the window's first maximum found once, as an index.

The training form before this one wrote the windows out as im2col columns (N, C, kh*kw, OH, OW), took their
maximum as a reduction and sent the gradient back as a broadcast pass over the columns and a col2im: four launches
and about 1.5 ms of resnet18's batch-64 step on an H100 for the stem's 3x3/2 pool (docs/benchmarks.md). Here:

- `max_pool2d_argmax_cl`: per output, the input offset within its plane (iy * W + ix) of the window's first
  maximum in row-major tap order (PyTorch's choice: ties go to the first tap, a NaN wins), as int32;
- `max_pool2d_take_cl`: the pooled output, the input at that offset (where both run in one plan, the offsets'
  kernel writes it instead: scheduler `_pool_max_with_offsets`);
- `max_pool2d_grad_cl`: per input pixel, the sum of the output gradients of the windows that cover it and picked
  it, read through the same tap gather as col2im (`conv.covering_taps`): one work-item per pixel, or per block of
  sh x sw pixels for strided pools (`_grad_blocks`), no atomics.

None has a gradient of its own: `plait.nn.functional.max_pool2d` records the pool's gradient with a custom rule.
They render for OpenCL only; the cpu has its own kernels (plait/graph/ops/pool.py and pool_grad.py).
"""

from __future__ import annotations

from typing import Any

from plait import dtypes
from plait.codegen.cstyle import RenderedKernel
from plait.codegen.expr import ExprBuilder, Idx
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.conv import covering_taps
from plait.graph.ops.pool import PoolGeometry


def supports(x: Node) -> bool:
    """Whether these kernels take a pool over `x`: a float tensor on an OpenCL device."""
    return x.dtype.is_float and x.device.startswith("opencl")


def _plane(geo: PoolGeometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (geo.n, geo.c, geo.h, geo.w), (geo.n, geo.c, geo.oh, geo.ow)


def _windows_reach_input(size: int, k: int, s: int, p: int, d: int, o: int) -> bool:
    """Whether each of the `o` windows along one axis has a tap inside the input (else it would have no maximum)."""
    return all(any(0 <= i * s - p + t * d < size for t in range(k)) for i in range(o))


def max_pool2d_argmax_cl(x: Node, geo: PoolGeometry) -> Node:
    """The (N, C, OH, OW) int32 offsets within each input plane of the windows' first maxima."""
    if x.shape != _plane(geo)[0]:
        raise ShapeError(f"max_pool2d_argmax_cl: input shape {x.shape} does not match the pooling geometry {geo}")
    rows = _windows_reach_input(geo.h, geo.kh, geo.sh, geo.ph, geo.dh, geo.oh)
    if not (rows and _windows_reach_input(geo.w, geo.kw, geo.sw, geo.pw, geo.dw, geo.ow)):
        raise ShapeError(
            f"max_pool2d_argmax_cl: a window of the pooling geometry {geo} lies wholly in the padding or past the "
            f"input {x.shape}; keep the padding at most half the kernel and the outputs to torch's size rule"
        )
    if not supports(x):
        raise UnsupportedError(
            f"max_pool2d_argmax_cl {x.shape}: float tensors on OpenCL devices only (got {x.dtype.name} on {x.device});"
            " plait.nn.functional.max_pool2d picks the cpu's pooling kernels there"
        )
    return Node("max_pool2d_argmax_cl", (x,), geo, _plane(geo)[1], dtypes.int32, x.device)


def max_pool2d_take_cl(x: Node, at: Node, geo: PoolGeometry) -> Node:
    """The pooled output: `x` at the offsets `at` from `max_pool2d_argmax_cl(x, geo)`."""
    if x.shape != _plane(geo)[0] or at.shape != _plane(geo)[1] or at.dtype != dtypes.int32:
        raise ShapeError(
            f"max_pool2d_take_cl: input {x.shape} and offsets {at.shape} ({at.dtype.name}) do not match the pooling "
            f"geometry {geo} (want int32 offsets of shape {_plane(geo)[1]})"
        )
    return Node("max_pool2d_take_cl", (x, at), geo, at.shape, x.dtype, x.device)


def max_pool2d_grad_cl(at: Node, g: Node, geo: PoolGeometry) -> Node:
    """d(loss)/dx of a max pool whose windows picked the offsets `at`, given `g` = d(loss)/d(output)."""
    if at.shape != _plane(geo)[1] or g.shape != at.shape or at.dtype != dtypes.int32:
        raise ShapeError(
            f"max_pool2d_grad_cl: offsets {at.shape} ({at.dtype.name}) and output gradient {g.shape} do not match "
            f"the pooling geometry {geo} (want int32 offsets and a gradient of shape {_plane(geo)[1]})"
        )
    return Node("max_pool2d_grad_cl", (at, g), geo, _plane(geo)[0], g.dtype, g.device)


def _only_opencl(r: Any, out: Node) -> None:
    if r.dialect != "opencl":
        raise UnsupportedError(f"{out.op} {out.shape}: rendered for OpenCL devices only; the cpu has pool_grad.py")


def _argmax_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    """One work-item per output scanning its window's taps in row-major order; the bounds tests drop the padding
    and ceil-mode overhang (every window holds at least one input pixel: `max_pool2d_argmax_cl` checks). With the
    pooled output ahead of the input in `inputs` (scheduler `_pool_max_with_offsets`) it also writes the maximum
    there: the value `max_pool2d_take_cl` would read at the offset, bit for bit."""
    _only_opencl(r, out)
    geo: PoolGeometry = out.arg
    x = out.srcs[0]
    take = inputs[0] if inputs[0].op == "max_pool2d_take_cl" and inputs[0].srcs[1] is out else None
    rest = inputs[1:] if take is not None else inputs
    ct = r.compute_type(x.dtype)
    # buffers in the item's order: the offsets, then the pooled output where this kernel writes it, then the input
    # (or, where the scheduler left it unmade, the buffers its expression reads: `_pool_inputs_inline`)
    first = 1 if take is None else 2
    names = {n.uid: f"b{i}" for i, n in enumerate(rest, first)}
    params = [r.param(out.dtype, "b0", True), *([r.param(take.dtype, "b1", True)] if take else [])]
    params += [r.param(n.dtype, names[n.uid], False) for n in rest]
    idx_t = r.idx_type(x.size, *(n.size for n in rest))
    taps = []
    for ky in range(geo.kh):
        taps.append(f"{{ int iy = y0 + {ky * geo.dh}; if (iy >= 0 && iy < {geo.h}) {{")
        for kx in range(geo.kw):
            ix = f"x0 + {kx * geo.dw}"
            if x.uid in names:
                pre, v = "", r.load(x.dtype, names[x.uid], f"xb + iy * {geo.w} + {ix}")
            else:
                b = ExprBuilder(r, names, idx_t)
                v = b.value(x, Idx(x.shape, coords=["n_", "c_", "iy", f"({ix})"]))
                pre = " ".join(b.lines) + " "
            taps.append(
                f"  if ({ix} >= 0 && {ix} < {geo.w}) {{ {pre}{ct} v = {v};"
                f" if (at < 0 || v > m || (v != v && m == m)) {{ m = v; at = iy * {geo.w} + {ix}; }} }}"
            )
        taps.append("} }")
    coords = [] if x.uid in names else [f"long n_ = nc / {geo.c}, c_ = nc % {geo.c};"]
    body = [
        f"int ox = gid % {geo.ow}, oy = (gid / {geo.ow}) % {geo.oh}; long nc = gid / {geo.oh * geo.ow};",
        *coords,
        f"long xb = nc * {geo.h * geo.w};",
        f"int y0 = oy * {geo.sh} - {geo.ph}, x0 = ox * {geo.sw} - {geo.pw};",
        f"int at = -1; {ct} m = 0;",
        *taps,
        r.store(out.dtype, "b0", "gid", "at"),
    ]
    if take is not None:
        body.append(r.store(take.dtype, "b1", "gid", "m"))
    lines, gs, ls = r.parallel_for("gid", out.size, body, r.idx_type(x.size), out.size * geo.kh * geo.kw)
    kernel = r._finish("POOLARG", out, params, lines, gs, ls)
    kernel.writes = 1 if take is None else 2
    return kernel


def _take_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    _only_opencl(r, out)
    geo: PoolGeometry = out.arg
    x, at = inputs
    params = [r.param(out.dtype, "b0", True), r.param(x.dtype, "b1", False), r.param(at.dtype, "b2", False)]
    plane = geo.oh * geo.ow
    body = [r.store(out.dtype, "b0", "gid", r.load(x.dtype, "b1", f"gid / {plane} * {geo.h * geo.w} + b2[gid]"))]
    lines, gs, ls = r.parallel_for("gid", out.size, body, r.idx_type(x.size), out.size)
    return r._finish("POOLTAKE", out, params, lines, gs, ls)


def _grad_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    """One work-item per input pixel, adding in output order the gradients of the covering windows that picked it
    (for a 3x3/2 pool at most four windows, each one int32 compare); strided pools without dilation go by blocks
    (`_grad_blocks`)."""
    _only_opencl(r, out)
    geo: PoolGeometry = out.arg
    at, g = inputs
    ct = r.compute_type(g.dtype)
    params = [r.param(out.dtype, "b0", True), r.param(at.dtype, "b1", False), r.param(g.dtype, "b2", False)]
    if geo.dh == geo.dw == 1 and geo.sh * geo.sw > 1:
        return _grad_blocks(r, out, params, ct)
    body = [
        f"int ix = gid % {geo.w}, iy = (gid / {geo.w}) % {geo.h}; long nc = gid / {geo.h * geo.w};",
        f"long ob = nc * {geo.oh * geo.ow}; int here = iy * {geo.w} + ix;",
        f"{ct} acc = 0;",
        *covering_taps(
            geo,
            [
                f"long o = ob + oy * {geo.ow} + ox;",
                f"if (b1[o] == here) acc += {r.load(g.dtype, 'b2', 'o')};",
            ],
            by_output=True,
        ),
        r.store(out.dtype, "b0", "gid", "acc"),
    ]
    lines, gs, ls = r.parallel_for("gid", out.size, body, r.idx_type(out.size), out.size * geo.kh * geo.kw)
    return r._finish("POOLGRAD", out, params, lines, gs, ls)


def _grad_blocks(r: Any, out: Node, params: list[str], ct: str) -> RenderedKernel:
    """The pool gradient by blocks of sh x sw input pixels, each block starting where a window starts: the windows
    that can cover a block are the (qy + 1) x (qx + 1) ending at its own (qy = ceil((kh - 1) / sh)), so one work-item
    reads their offsets and gradients once and sums, per pixel of the block, the windows that picked it in row-major
    output order. The sums are those of the per-pixel form, bit for bit, with about half the loads for a 3x3/2 pool
    (four windows for four pixels where each pixel alone visits up to four)."""
    geo: PoolGeometry = out.arg
    qy, qx = -(-(geo.kh - 1) // geo.sh), -(-(geo.kw - 1) // geo.sw)
    ay, ax = geo.ph // geo.sh, geo.pw // geo.sw  # the block holding input row / column 0
    nby, nbx = (geo.h - 1 + geo.ph) // geo.sh - ay + 1, (geo.w - 1 + geo.pw) // geo.sw - ax + 1
    body = [
        f"int bx = gid % {nbx} + {ax}, by = (gid / {nbx}) % {nby} + {ay}; long nc = gid / {nby * nbx};",
        f"long ob = nc * {geo.oh * geo.ow}, xb = nc * {geo.h * geo.w};",
    ]
    wins = [(u, v) for u in range(qy + 1) for v in range(qx + 1)]
    for u, v in wins:
        oy, ox = f"(by - {qy - u})", f"(bx - {qx - v})"
        body += [
            f"int a{u}_{v} = -1; {ct} g{u}_{v} = 0;",
            f"if ({oy} >= 0 && {oy} < {geo.oh} && {ox} >= 0 && {ox} < {geo.ow}) {{ long o = ob + {oy} * {geo.ow} + {ox};"
            f" a{u}_{v} = b1[o]; g{u}_{v} = {r.load(out.dtype, 'b2', 'o')}; }}",
        ]
    for j in range(geo.sh):
        for i in range(geo.sw):
            iy, ix = f"by * {geo.sh} - {geo.ph} + {j}", f"bx * {geo.sw} - {geo.pw} + {i}"
            sums = " ".join(f"if (a{u}_{v} == here) acc += g{u}_{v};" for u, v in wins)
            body.append(
                f"{{ int iy = {iy}, ix = {ix}; if (iy >= 0 && iy < {geo.h} && ix >= 0 && ix < {geo.w}) {{"
                f" int here = iy * {geo.w} + ix; {ct} acc = 0; {sums} {r.store(out.dtype, 'b0', 'xb + here', 'acc')} }} }}"
            )
    blocks = geo.n * geo.c * nby * nbx
    lines, gs, ls = r.parallel_for("gid", blocks, body, r.idx_type(out.size), blocks * len(wins))
    return r._finish("POOLGRAD", out, params, lines, gs, ls)


def _no_grad(node: Node, g: Node) -> tuple[Node | None, ...]:
    raise UnsupportedError(
        f"{node.op} {node.shape}: no gradient of its own; plait.nn.functional.max_pool2d records the pool's gradient"
        " with a rule of its own (no double backward through a max pool)"
    )


register(OpDef("max_pool2d_argmax_cl", "custom", _no_grad, kernel=_argmax_kernel))
register(OpDef("max_pool2d_take_cl", "custom", _no_grad, kernel=_take_kernel))
register(OpDef("max_pool2d_grad_cl", "custom", _no_grad, kernel=_grad_kernel))
