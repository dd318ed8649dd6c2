"""The weight gradient of a depthwise convolution (one filter per channel) as one op with a C kernel of its own.

dW[c, ky, kx] = sum over images and output positions of dy[n, c, oy, ox] * x[n, c, oy*sh - ph + ky*dh, ox*sw - pw +
kx*dw]: per channel, every image's output-gradient rows dotted with the input rows each kernel tap reads, in place.
The column form wrote the image's patch columns (kh*kw times the input: 231 MB for mobilenet_v2's first depthwise
layer at batch 16) for a GEMV per image and channel to read, and, since the columns stayed a buffer, the forward
read them too instead of gathering from the image. `plait.nn.functional` uses this kernel on the cpu (float32);
OpenCL has its own (plait/graph/ops/depthwise_cl.py).
"""

from __future__ import annotations

from typing import Any

from plait import dtypes
from plait.codegen.cstyle import RenderedKernel
from plait.codegen.gemm_c import VW
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.conv import Window


def supports(x: Node, win: Window) -> bool:
    """Whether the kernel takes this convolution's input: float32 on the cpu, per-image (unfolded) geometry."""
    return x.dtype == dtypes.float32 and x.device.startswith("cpu") and not win.fold


def depthwise_wgrad_c(dy: Node, x: Node, win: Window) -> Node:
    """The weight gradient (C, 1, kh, kw) of a depthwise convolution of `x` (N, C, H, W) whose output gradient is
    `dy` (N, C, OH, OW)."""
    if dy.shape != (win.n, win.c, win.oh, win.ow) or x.shape != (win.n, win.c, win.h, win.w):
        raise ShapeError(
            f"depthwise_wgrad_c: output gradient {dy.shape} and input {x.shape} do not match the window {win}"
        )
    if not (supports(x, win) and supports(dy, win)):
        raise UnsupportedError(
            f"depthwise_wgrad_c {x.shape}: float32 on the cpu device with a per-image window only (got "
            f"{x.dtype.name} on {x.device}); plait.nn.functional takes the column form elsewhere"
        )
    return Node("depthwise_wgrad_c", (dy, x), win, (win.c, 1, win.kh, win.kw), dy.dtype, dy.device)


def _cols(w: Window, kx: int) -> tuple[int, int, int]:
    """(a, lo, hi): kernel column kx reads input column ox * sw - a, inside the image for outputs [lo, hi)."""
    a = w.pw - kx * w.dw
    lo = -(-a // w.sw) if a > 0 else 0
    hi = min(w.ow, (w.w - 1 + a) // w.sw + 1) if w.w - 1 + a >= 0 else 0
    return a, min(lo, hi), hi


def _body(w: Window) -> list[str]:
    """C lines for channel `c`: the output-gradient rows times the input rows each kernel tap reads, added lane by
    lane into that tap's row of partial sums, each summed once at the end (no horizontal sum per row). An output row
    whose kernel rows all lie inside the image takes every tap in one vectorised loop over the output columns whose
    taps all read inside it (a loop per row and tap ran 3 GFLOP/s: loop overhead); other rows go kernel row by
    kernel row, and the few edge columns tap by tap with their own bounds. At stride 1 the inner rows' columns in
    whole vectors (VW columns) go first, each block's taps summed in registers over every image and row (`_blocks`:
    2.2x faster for mobilenet_v2's 144x56x56 layer), so the partial sums take only the rest."""
    kk, kh, kw, sw = w.kh * w.kw, w.kh, w.kw, w.sw
    cols = [_cols(w, kx) for kx in range(kw)]
    ilo, ihi = max(lo for _, lo, _ in cols), min(hi for _, _, hi in cols)
    ihi = max(ilo, ihi)
    bhi = ilo + (ihi - ilo) // VW * VW if sw == 1 else ilo  # columns [ilo, bhi) go in register blocks

    def taps(rows: list[int] | None) -> list[str]:  # rows None: the kernel row `ky` of the enclosing loop
        out = []
        for ky in rows if rows is not None else [None]:
            row = f"xr{ky}" if ky is not None else "xr"
            t = f"{ky * kw}" if ky is not None else f"ky * {kw}"
            out += [f"part[{t} + {kx}][ox] += gv * {row}[ox * {sw} - {a}];" for kx, (a, _, _) in enumerate(cols)]
        return out

    edge = [
        f"for (int kx = 0; kx < {kw}; kx++) {{",
        f"  int ix = ox * {sw} - {w.pw} + kx * {w.dw};",
        f"  if (ix >= 0 && ix < {w.w}) part[ky * {kw} + kx][ox] += gr[ox] * xr[ix];",
        "}",
    ]
    return [
        *_blocks(w, cols, ilo, bhi),
        f"float part[{kk}][{w.ow}];",
        f"for (int t = 0; t < {kk}; t++) for (int ox = 0; ox < {w.ow}; ox++) part[t][ox] = 0.0f;",
        f"for (int n = 0; n < {w.n}; n++) {{",
        f"  const float* g = b1 + ((long)n * {w.c} + c) * {w.oh * w.ow};",
        f"  const float* xp = b2 + ((long)n * {w.c} + c) * {w.h * w.w};",
        f"  for (int oy = 0; oy < {w.oh}; oy++) {{",
        f"    const float* restrict gr = g + (long)oy * {w.ow};",
        f"    int y0 = oy * {w.sh} - {w.ph};",
        f"    if (y0 >= 0 && y0 + {(kh - 1) * w.dh} < {w.h}) {{",
        *(f"      const float* restrict xr{ky} = xp + (long)(y0 + {ky * w.dh}) * {w.w};" for ky in range(kh)),
        "#pragma omp simd",
        f"      for (int ox = {bhi}; ox < {ihi}; ox++) {{",
        "        float gv = gr[ox];",
        *("        " + ln for ln in taps(list(range(kh)))),
        "      }",
        "    } else {",
        f"      for (int ky = 0; ky < {kh}; ky++) {{",
        f"        int iy = y0 + ky * {w.dh};",
        f"        if (iy < 0 || iy >= {w.h}) continue;",
        f"        const float* restrict xr = xp + (long)iy * {w.w};",
        "#pragma omp simd",
        f"        for (int ox = {ilo}; ox < {ihi}; ox++) {{",
        "          float gv = gr[ox];",
        *("          " + ln for ln in taps(None)),
        "        }",
        "      }",
        "    }",
        f"    for (int ky = 0; ky < {kh}; ky++) {{",
        f"      int iy = y0 + ky * {w.dh};",
        f"      if (iy < 0 || iy >= {w.h}) continue;",
        f"      const float* xr = xp + (long)iy * {w.w};",
        f"      for (int ox = 0; ox < {ilo}; ox++)",
        *("        " + ln for ln in edge),
        f"      for (int ox = {ihi}; ox < {w.ow}; ox++)",
        *("        " + ln for ln in edge),
        "    }",
        "  }",
        "}",
        f"for (int t = 0; t < {kk}; t++) {{",
        "  float s = 0.0f;",
        f"  for (int ox = 0; ox < {w.ow}; ox++) s += part[t][ox];",
        f"  b0[(long)c * {kk} + t] = s + tot[t];",
        "}",
    ]


def _blocks(w: Window, cols: list[tuple[int, int, int]], ilo: int, bhi: int) -> list[str]:
    """C lines: `tot[t]`, each tap's sum over the inner rows (every kernel row inside the image) and the columns
    [ilo, bhi) (stride 1, every tap inside), VW columns at a time in one vector accumulator per tap."""
    kk, kh = w.kh * w.kw, w.kh
    oy_lo = min(w.oh, -(-w.ph // w.sh))
    last = w.h - 1 - (kh - 1) * w.dh + w.ph  # the largest oy * sh whose window's last kernel row is inside
    oy_hi = max(oy_lo, min(w.oh, last // w.sh + 1)) if last >= 0 else oy_lo
    v, vu = f"dwv{VW}", f"dwv{VW}u"
    acc = [
        f"acc[{ky * w.kw + kx}] += gv * *(const {vu}*)(xr + {ky * w.dh * w.w - a});"
        for ky in range(kh)
        for kx, (a, _, _) in enumerate(cols)
    ]
    return [
        f"typedef float {v} __attribute__((vector_size({VW * 4})));",
        f"typedef float {vu} __attribute__((vector_size({VW * 4}), aligned(4)));",
        f"float tot[{kk}];",
        f"for (int t = 0; t < {kk}; t++) tot[t] = 0.0f;",
        f"for (int o0 = {ilo}; o0 < {bhi}; o0 += {VW}) {{",
        f"  {v} acc[{kk}];",
        f"  for (int t = 0; t < {kk}; t++) acc[t] = ({v}){{0}};",
        f"  for (int n = 0; n < {w.n}; n++) {{",
        f"    const float* g = b1 + ((long)n * {w.c} + c) * {w.oh * w.ow} + o0;",
        f"    const float* xp = b2 + ((long)n * {w.c} + c) * {w.h * w.w} + o0;",
        f"    for (int oy = {oy_lo}; oy < {oy_hi}; oy++) {{",
        f"      {v} gv = *(const {vu}*)(g + (long)oy * {w.ow});",
        f"      const float* xr = xp + (long)(oy * {w.sh} - {w.ph}) * {w.w};",
        *("      " + ln for ln in acc),
        "    }",
        "  }",
        f"  for (int t = 0; t < {kk}; t++) for (int l = 0; l < {VW}; l++) tot[t] += acc[t][l];",
        "}",
    ]


def _kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    w: Window = out.arg
    if r.dialect != "c":
        raise UnsupportedError(f"depthwise_wgrad_c {out.shape}: this kernel runs on the cpu device only")
    params = [r.param(out.dtype, "b0", True), *(r.param(t.dtype, f"b{i + 1}", False) for i, t in enumerate(inputs))]
    work = w.n * w.c * w.oh * w.ow * w.kh * w.kw
    lines, gs, ls = r.parallel_for("c", w.c, _body(w), "long", work)
    return r._finish("DWWGRAD", out, params, lines, gs, ls)


def _no_grad(node: Node, g: Node) -> tuple[Node | None, ...]:
    raise UnsupportedError(
        f"depthwise_wgrad_c {node.shape}: a weight gradient has no gradient here (no double backward)"
    )


register(OpDef("depthwise_wgrad_c", "custom", _no_grad, kernel=_kernel))
