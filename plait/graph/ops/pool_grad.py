"""The input gradient of a max pool as one op with a kernel of its own on the cpu device.

Each window's output gradient goes to the first tap (row-major in the window) whose input equals the pooled
maximum, as PyTorch's argmax does, so ties (a window of zeros after a ReLU) are not split. The kernel rescans each
window from the input and the pooled output, so the forward stores no indices and no window columns: one pass over a
plane's outputs, adding into that plane's gradient while it is in cache. `plait.nn.functional.max_pool2d` uses it
under autograd on the cpu (float32, the same inputs as the forward pooling kernel of plait/graph/ops/pool.py);
elsewhere the gradient flows through the pool's im2col columns.
"""

from __future__ import annotations

from typing import Any

from plait import dtypes
from plait.codegen.cstyle import RenderedKernel
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.pool import PoolGeometry


def supports(x: Node) -> bool:
    """Whether the kernel takes a pool over `x`: float32 on the cpu device (the forward pooling kernel's inputs)."""
    return x.dtype == dtypes.float32 and x.device.startswith("cpu")


def max_pool2d_grad(x: Node, y: Node, g: Node, geo: PoolGeometry) -> Node:
    """d(loss)/dx of `y` = max_pool2d(`x`) over the windows `geo`, given `g` = d(loss)/dy."""
    if x.shape != (geo.n, geo.c, geo.h, geo.w) or y.shape != g.shape or y.shape != (geo.n, geo.c, geo.oh, geo.ow):
        raise ShapeError(
            f"max_pool2d_grad: input {x.shape}, pooled {y.shape} and its gradient {g.shape} do not match the "
            f"pooling geometry {geo}"
        )
    if not all(supports(t) and t.dtype == x.dtype for t in (x, y, g)):
        raise UnsupportedError(
            f"max_pool2d_grad {x.shape}: float32 on the cpu device only (got {x.dtype.name} on {x.device}); "
            "plait.nn.functional.max_pool2d differentiates through im2col columns elsewhere"
        )
    return Node("max_pool2d_grad", (x, y, g), geo, x.shape, x.dtype, x.device)


def _body(geo: PoolGeometry) -> list[str]:
    """C lines for plane `pl`: zero its input gradient, then per output row find each window's first maximum and add
    the output's gradient there. Rows whose windows lie inside the input take, for the inner columns, one vectorised
    loop over every tap with constant offsets that keeps the first tap equal to the maximum (taps run last to first
    through selects: no data-dependent branch, 3x faster than a searching loop). Everything else (edge columns,
    kernel rows outside the input, a window whose maximum is NaN, which no tap equals) takes a scalar search with
    bounds tests. The gradients are added in a scalar loop: neighbouring windows may pick the same input."""
    h, w, oh, ow, kh, kw, sw, dw = geo.h, geo.w, geo.oh, geo.ow, geo.kh, geo.kw, geo.sw, geo.dw
    lo, hi = geo.inner_cols()
    taps = [
        f"{{ float v = r{ky}[ox * {sw} + {kx * dw}]; t = v == m ? {ky * kw + kx} : t; }}"
        for ky in reversed(range(kh))
        for kx in reversed(range(kw))
    ]
    return [
        f"const float* restrict x = b1 + pl * {h * w}L;",
        f"float* restrict dx = b0 + pl * {h * w}L;",
        f"for (long i = 0; i < {h * w}; i++) dx[i] = 0.0f;",
        f"int tap[{ow}];",
        f"for (int oy = 0; oy < {oh}; oy++) {{",
        f"  int y0 = oy * {geo.sh} - {geo.ph}, ky0 = 0, ky1 = {kh};",
        f"  while (ky0 < ky1 && y0 + ky0 * {geo.dh} < 0) ky0++;",
        f"  while (ky1 > ky0 && y0 + (ky1 - 1) * {geo.dh} >= {h}) ky1--;",
        f"  long ro[{kh}];  /* input column ix of kernel row ky is x[ro[ky] + {geo.pw} + ix] */",
        f"  for (int ky = 0; ky < {kh}; ky++) ro[ky] = (long)(y0 + ky * {geo.dh}) * {w} - {geo.pw};",
        f"  const float* yr = b2 + (pl * {oh} + oy) * {ow}L;",
        f"  const float* gr = b3 + (pl * {oh} + oy) * {ow}L;",
        f"  int full = ky0 == 0 && ky1 == {kh};",
        "  if (full) {",
        *(f"    const float* r{ky} = x + ro[{ky}];" for ky in range(kh)),
        "#pragma omp simd",
        f"    for (int ox = {lo}; ox < {hi}; ox++) {{",
        "      float m = yr[ox];",
        "      int t = -1;",
        *(f"      {t}" for t in taps),
        "      tap[ox] = t;",
        "    }",
        "  }",
        f"  for (int ox = 0; ox < {ow}; ox++) {{",
        "    long at = -1;",
        f"    if (full && ox >= {lo} && ox < {hi} && tap[ox] >= 0) {{",
        f"      at = ro[tap[ox] / {kw}] + ox * {sw} + tap[ox] % {kw} * {dw};",
        "    } else {",
        "      float m = yr[ox];",
        "      for (int ky = ky1 - 1; ky >= ky0; ky--)",
        f"        for (int kx = {kw - 1}; kx >= 0; kx--) {{",
        f"          int ix = ox * {sw} - {geo.pw} + kx * {dw};",
        f"          if (ix < 0 || ix >= {w}) continue;",
        f"          float v = x[ro[ky] + {geo.pw} + ix];",
        f"          at = (v == m || (v != v && m != m)) ? ro[ky] + {geo.pw} + ix : at;",
        "        }",
        "    }",
        "    if (at >= 0) dx[at] += gr[ox];",
        "  }",
        "}",
    ]


def _kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    geo: PoolGeometry = out.arg
    if r.dialect != "c":
        raise UnsupportedError(f"max_pool2d_grad {out.shape}: the dedicated kernel runs on the cpu device only")
    params = [r.param(out.dtype, "b0", True), *(r.param(t.dtype, f"b{i + 1}", False) for i, t in enumerate(inputs))]
    work = geo.n * geo.c * (geo.h * geo.w + geo.oh * geo.ow * geo.kh * geo.kw)
    lines, gs, ls = r.parallel_for("pl", geo.n * geo.c, _body(geo), "long", work)
    return r._finish("POOLGRAD", out, params, lines, gs, ls)


def _no_grad(node: Node, g: Node) -> tuple[Node | None, ...]:
    raise UnsupportedError(
        f"max_pool2d_grad {node.shape}: a max pool's gradient has no gradient of its own here (no double backward)"
    )


register(OpDef("max_pool2d_grad", "custom", _no_grad, kernel=_kernel))
