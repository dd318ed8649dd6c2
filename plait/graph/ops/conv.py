"""im2col and col2im: the data movement of convolution as implicit-GEMM operands.

`im2col(x)` turns an (N, C, H, W) input into (N, C*kh*kw, OH*OW) patch columns with plain nested loops (a row of
output positions is a strided run of one input row), so a convolution becomes one batched GEMM whose result is
already NCHW. `col2im` is its adjoint (each input pixel gathers the columns that read it: deterministic, no
atomics), and each op's gradient is the other one.

With `Window.fold` the columns are laid out (C*kh*kw, N, OH*OW) instead: the batch folded into the GEMM's columns.
Training uses that layout, because then a convolution's weight gradient is one GEMM whose K runs over every image's
output positions (dy @ columns^T, K = N*OH*OW) rather than a product per image summed afterwards, and the forward
and input-gradient products are each one GEMM over all images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from plait.codegen.cstyle import RenderedKernel
from plait.errors import ShapeError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


@dataclass(frozen=True)
class Window:
    """Sliding-window geometry of a 2-D convolution over an (N, C, H, W) input."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int = 1
    sw: int = 1
    ph: int = 0
    pw: int = 0
    dh: int = 1
    dw: int = 1
    fold: bool = False  # columns laid out (C*kh*kw, N, OH*OW) instead of (N, C*kh*kw, OH*OW)

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1

    @property
    def cols_shape(self) -> tuple[int, int, int]:
        if self.fold:
            return (self.c * self.kh * self.kw, self.n, self.oh * self.ow)
        return (self.n, self.c * self.kh * self.kw, self.oh * self.ow)

    def col_row(self, n: str, ck: str) -> str:
        """C expression: the start of the output-position run of image `n`, patch row `ck` in the columns."""
        if self.fold:
            return f"(((long)({ck}) * {self.n} + ({n})) * {self.oh * self.ow})"
        return f"(((long)({n}) * {self.c * self.kh * self.kw} + ({ck})) * {self.oh * self.ow})"


def im2col(x: Node, win: Window) -> Node:
    if x.shape != (win.n, win.c, win.h, win.w):
        raise ShapeError(f"im2col: input shape {x.shape} does not match the window geometry {win}")
    if win.oh < 1 or win.ow < 1:
        raise ShapeError(
            f"im2col: input {x.shape} is too small for kernel {(win.kh, win.kw)} with padding {(win.ph, win.pw)}"
        )
    return Node("im2col", (x,), win, win.cols_shape, x.dtype, x.device)


def col2im(cols: Node, win: Window) -> Node:
    if cols.shape != win.cols_shape:
        raise ShapeError(f"col2im: columns of shape {cols.shape} do not match the window geometry {win}")
    return Node("col2im", (cols,), win, (win.n, win.c, win.h, win.w), cols.dtype, cols.device)


class TapGeometry(Protocol):
    """A sliding window's geometry as the tap gathers read it (`Window`, and the pooling geometry whose output size
    may count ceil-mode windows)."""

    @property
    def kh(self) -> int: ...
    @property
    def kw(self) -> int: ...
    @property
    def sh(self) -> int: ...
    @property
    def sw(self) -> int: ...
    @property
    def ph(self) -> int: ...
    @property
    def pw(self) -> int: ...
    @property
    def dh(self) -> int: ...
    @property
    def dw(self) -> int: ...
    @property
    def oh(self) -> int: ...
    @property
    def ow(self) -> int: ...


def covering_taps(g: TapGeometry, inner: list[str], by_output: bool = False) -> list[str]:
    """C lines visiting, for the input pixel (`iy`, `ix`), every kernel tap (ky, kx) whose window reads it,
    in (ky, kx) order, with that window's output position (oy, ox) in scope for `inner`. A tap reads the pixel when
    iy + ph - ky * dh is a multiple of the stride that lands on an output row (and likewise along x): the gather
    form of a strided transposed convolution, which col2im, the strided depthwise input gradient and the max-pool
    gradient share, so each input pixel is written once by one work-item (no atomics, a fixed order). `by_output`
    visits the taps in reverse, so the windows in row-major output order (the order PyTorch adds a pool's
    gradients). Without dilation the covering windows are a range of output rows and columns (at most
    ceil(k / s) each), looped over directly instead of testing every tap's stride parity."""
    if g.dh == 1 and g.dw == 1:
        return [
            *_covering_range("y", g.kh, g.sh, g.ph, g.oh),
            *_covering_range("x", g.kw, g.sw, g.pw, g.ow),
            f"for (int oy = {'oyl' if by_output else 'oyh'}; {'oy <= oyh' if by_output else 'oy >= oyl'}; "
            f"oy{'++' if by_output else '--'}) {{",
            f"  int ky = iy + {g.ph} - oy * {g.sh};",
            f"  for (int ox = {'oxl' if by_output else 'oxh'}; {'ox <= oxh' if by_output else 'ox >= oxl'}; "
            f"ox{'++' if by_output else '--'}) {{",
            f"    int kx = ix + {g.pw} - ox * {g.sw};",
            *("    " + ln for ln in inner),
            "  }",
            "}",
        ]
    ky_loop, kx_loop = (
        (f"int ky = {g.kh - 1}; ky >= 0; ky--", f"int kx = {g.kw - 1}; kx >= 0; kx--")
        if by_output
        else (f"int ky = 0; ky < {g.kh}; ky++", f"int kx = 0; kx < {g.kw}; kx++")
    )
    return [
        f"for ({ky_loop}) {{",
        f"  int ty = iy + {g.ph} - ky * {g.dh};",
        f"  if (ty < 0 || ty % {g.sh} != 0 || ty / {g.sh} >= {g.oh}) continue;",
        f"  int oy = ty / {g.sh};",
        f"  for ({kx_loop}) {{",
        f"    int tx = ix + {g.pw} - kx * {g.dw};",
        f"    if (tx < 0 || tx % {g.sw} != 0 || tx / {g.sw} >= {g.ow}) continue;",
        f"    int ox = tx / {g.sw};",
        *("    " + ln for ln in inner),
        "  }",
        "}",
    ]


def _covering_range(a: str, k: int, s: int, p: int, o: int) -> list[str]:
    """C lines: the output positions [o{a}l, o{a}h] along axis `a` whose undilated windows cover input i{a}."""
    return [
        f"int o{a}l = i{a} + {p - (k - 1)}; o{a}l = o{a}l <= 0 ? 0 : (o{a}l + {s - 1}) / {s};",
        f"int o{a}h = (i{a} + {p}) / {s}; if (o{a}h > {o - 1}) o{a}h = {o - 1};",
    ]


def _ox_range(w: Window) -> list[str]:
    """C lines: `a` (input column = ox * sw - a) and the output columns [lo, hi) whose input column lies inside
    the image for the kernel column `kx`, so the loop over them needs no bounds test and vectorises."""
    return [
        f"int a = {w.pw} - kx * {w.dw};",
        f"int lo = a > 0 ? (a + {w.sw - 1}) / {w.sw} : 0;",
        f"int hi = {w.w - 1} + a < 0 ? 0 : ({w.w - 1} + a) / {w.sw} + 1;",
        f"if (hi > {w.ow}) hi = {w.ow};",
        "if (lo > hi) lo = hi;",
    ]


def _col2im_c(w: Window, ct: str, load: Any, store: Any, cdt: Any, odt: Any, parallel: bool) -> list[str]:
    """C col2im: one input row per iteration, summed in a row of accumulators by adding each kernel tap's run of
    columns (a strided add, contiguous when the stride is 1) instead of testing every tap per pixel. Each pixel
    still adds its taps in (ky, kx) order from zero, the gather's order, so the result is the same to the bit."""
    kk = w.kh * w.kw
    pragma = ["#pragma omp parallel for collapse(3) schedule(static)"] if parallel else []
    return [
        *pragma,
        f"for (int n = 0; n < {w.n}; n++) for (int c = 0; c < {w.c}; c++) for (int iy = 0; iy < {w.h}; iy++) {{",
        f"  {ct} acc[{w.w}];",
        f"  for (int ix = 0; ix < {w.w}; ix++) acc[ix] = 0;",
        f"  for (int ky = 0; ky < {w.kh}; ky++) {{",
        f"    int ty = iy + {w.ph} - ky * {w.dh};",
        f"    if (ty < 0 || ty % {w.sh} != 0 || ty / {w.sh} >= {w.oh}) continue;",
        f"    for (int kx = 0; kx < {w.kw}; kx++) {{",
        *("      " + ln for ln in _ox_range(w)),
        f"      long src = {w.col_row('n', f'c * {kk} + ky * {w.kw} + kx')} + (long)(ty / {w.sh}) * {w.ow};",
        f"      for (int ox = lo; ox < hi; ox++) acc[ox * {w.sw} - a] += {load(cdt, 'b1', 'src + ox')};",
        "    }",
        "  }",
        f"  long o = (((long)n * {w.c} + c) * {w.h} + iy) * {w.w};",
        f"  for (int ix = 0; ix < {w.w}; ix++) {store(odt, 'b0', 'o + ix', 'acc[ix]')}",
        "}",
    ]


def _im2col_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    w: Window = out.arg
    x = inputs[0]
    ct, load, store = r.compute_type(x.dtype), r.load, r.store
    params = [r.param(out.dtype, "b0", True), r.param(x.dtype, "b1", False)]
    kk = w.kh * w.kw
    if r.dialect == "c":
        lines = [
            "#pragma omp parallel for collapse(2) schedule(static)",
            f"for (int n = 0; n < {w.n}; n++) for (int ck = 0; ck < {w.c * kk}; ck++) {{",
            f"  int c = ck / {kk}, ky = (ck / {w.kw}) % {w.kh}, kx = ck % {w.kw};",
            f"  long xb = ((long)n * {w.c} + c) * {w.h * w.w};",
            f"  long ob = {w.col_row('n', 'ck')};",
            f"  for (int oy = 0; oy < {w.oh}; oy++) {{",
            f"    int iy = oy * {w.sh} - {w.ph} + ky * {w.dh};",
            f"    int ok = iy >= 0 && iy < {w.h};",
            f"    for (int ox = 0; ox < {w.ow}; ox++) {{",
            f"      int ix = ox * {w.sw} - {w.pw} + kx * {w.dw};",
            f"      {ct} v = (ok && ix >= 0 && ix < {w.w}) ? {load(x.dtype, 'b1', f'xb + (long)iy * {w.w} + ix')} : 0;",
            f"      {store(out.dtype, 'b0', f'ob + (long)oy * {w.ow} + ox', 'v')}",
            "    }",
            "  }",
            "}",
        ]
        return r._finish("IM2COL", out, params, lines, (1,), None)
    total = out.size
    # consecutive work-items take consecutive output positions of one (image, patch row) in either layout
    row = (
        f"int n = nck % {w.n}; int ck = nck / {w.n};"
        if w.fold
        else f"int ck = nck % {w.c * kk}; int n = nck / {w.c * kk};"
    )
    lines = [
        "long gid = get_global_id(0);",
        f"if (gid >= {total}L) return;",
        f"int p = gid % {w.oh * w.ow}; long nck = gid / {w.oh * w.ow};",
        row,
        f"int c = ck / {kk}, ky = (ck / {w.kw}) % {w.kh}, kx = ck % {w.kw};",
        f"int oy = p / {w.ow}, ox = p % {w.ow};",
        f"int iy = oy * {w.sh} - {w.ph} + ky * {w.dh}, ix = ox * {w.sw} - {w.pw} + kx * {w.dw};",
        f"{ct} v = (iy >= 0 && iy < {w.h} && ix >= 0 && ix < {w.w}) ? "
        f"{load(x.dtype, 'b1', f'((long)n * {w.c} + c) * {w.h * w.w} + (long)iy * {w.w} + ix')} : 0;",
        store(out.dtype, "b0", "gid", "v"),
    ]
    ls = 256
    return r._finish("IM2COL", out, params, lines, (-(-total // ls) * ls,), (ls,))


def _col2im_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    w: Window = out.arg
    cols = inputs[0]
    ct, load = r.compute_type(cols.dtype), r.load
    params = [r.param(out.dtype, "b0", True), r.param(cols.dtype, "b1", False)]
    kk = w.kh * w.kw
    if r.dialect == "c":
        parallel = out.size * kk >= r.parallel_threshold and w.n * w.c * w.h > 1
        lines = _col2im_c(w, ct, load, r.store, cols.dtype, out.dtype, parallel)
        return r._finish("COL2IM", out, params, lines, (1,), None)
    body = [
        f"int ix = gid % {w.w}; int iy = (gid / {w.w}) % {w.h}; long nc = gid / {w.h * w.w};",
        f"int c = nc % {w.c}; int n = nc / {w.c};",
        f"{ct} acc = 0;",
        *covering_taps(
            w,
            [
                f"long off = {w.col_row('n', f'c * {kk} + ky * {w.kw} + kx')} + (long)oy * {w.ow} + ox;",
                f"acc += {load(cols.dtype, 'b1', 'off')};",
            ],
        ),
        r.store(out.dtype, "b0", "gid", "acc"),
    ]
    lines, gs, ls = r.parallel_for("gid", out.size, body, r.idx_type(out.size), out.size * kk)
    return r._finish("COL2IM", out, params, lines, gs, ls)


register(OpDef("im2col", "custom", lambda n, g: (col2im(g, n.arg),), kernel=_im2col_kernel))
register(OpDef("col2im", "custom", lambda n, g: (im2col(g, n.arg),), kernel=_col2im_kernel))
