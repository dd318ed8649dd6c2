"""OpenCL kernels for products with few rows (M < 16): batch-1 linear layers and depthwise convolutions.

A tiled GEMM would leave most of each tile idle and read B at a crawl; these products are bound by reading B once,
so the kernels are shaped around B's layout (kernel kind GEMV):

- B contiguous along K (a linear layer's weight, read as W^T): 32 work-items share one column, stride over K with
  (when aligned) float4 loads and meet in local memory, so each column's weights stream in coalesced 512-byte rows.
- a depthwise convolution (one filter per channel): each work-item computes a few neighbouring outputs of one row
  from the input rows' spans held in registers, the window's index math done once per work-item.
- otherwise (im2col columns, contiguous along N, or an implicit convolution whose taps are gathered from the image
  through the window, few-filter groups included): one work-item per column, neighbours read neighbouring columns.

Each work-item keeps one partial sum per row of A (at most 15), so A's rows are read once per column block.
"""

from __future__ import annotations

from typing import Any

from plait.codegen.cstyle import RenderedKernel
from plait.codegen.gemm import (
    Epilogue,
    GemmSpec,
    _cl_operands,
    _epi,
    _finish,
    _tile_coords,
    conv_gather,
    conv_wide,
)
from plait.errors import UnsupportedError

MAX_ROWS = 15
COLS_PER_GROUP = 8  # columns per work-group in the K-contiguous kernel (32 work-items each)


def render(spec: GemmSpec, r: Any = None, epi: Epilogue | None = None) -> RenderedKernel:
    """The GEMV kernel for `spec` (M <= MAX_ROWS)."""
    if spec.m > MAX_ROWS:
        raise UnsupportedError(f"GEMV kernel for {spec}: at most {MAX_ROWS} rows; use the tiled GEMM templates")
    if spec.b[2] == 1 and spec.k > 1 and spec.conv is None:
        return _render_k_contiguous(spec, r, epi)
    if _depthwise(spec):
        return _render_depthwise(spec, r, epi)
    return _render_columns(spec, r, epi)


def _depthwise(spec: GemmSpec) -> bool:
    """True for a depthwise convolution: one filter per group over one input channel (m 1, K the window's taps),
    each product's columns one image's output plane."""
    win = spec.conv
    return win is not None and spec.m == 1 and spec.k == win.kh * win.kw and spec.n == win.oh * win.ow


def _row_segment(ow: int) -> int:
    """Outputs per work-item along a row: 4, or a width that divides the row (7 for 7- and 14-wide planes), so
    narrow planes waste no work-items."""
    return next((v for v in (4, 7, 6, 5, 3) if ow % v == 0), 4)


def _render_depthwise(spec: GemmSpec, r: Any, epi: Epilogue | None) -> RenderedKernel:
    """A depthwise convolution with each work-item computing a few neighbouring outputs of one row: it keeps the
    filter's taps in registers, loads each input row's span once (stride and dilation included) and sums the taps
    from registers. The window's index math runs once per work-item instead of once per tap of every output (the
    per-column GEMV spent its time there: 38% of an H100's bandwidth at mobilenet_v2's batch-64 stride-1 layers).
    The source is straight-line (scalar registers, no loops), so no compiler has to unroll it to keep them."""
    win = spec.conv
    assert win is not None
    oh, ow, vx = win.oh, win.ow, _row_segment(win.ow)
    segs = -(-ow // vx)
    span = (vx - 1) * win.sw + (win.kw - 1) * win.dw + 1
    sak = spec.a[3]
    total = spec.batch * oh * segs
    idx = "long" if conv_wide(spec) or total >= 2**31 else "int"
    coords = _tile_coords(epi.root.shape, spec.batch, 1, spec.n, "0", "j") if epi is not None else None
    body = "".join(f"  const float w{t} = a[{t * sak}];\n" for t in range(win.kh * win.kw))
    body += "".join(f"  float acc{x} = 0.0f;\n" for x in range(vx))
    for ky in range(win.kh):
        loads = "".join(
            f"    const float v{s} = (uint)(ix0 + {s}) < {win.w}u ? row[ix0 + {s}] : 0.0f;\n" for s in range(span)
        )
        fmas = "".join(
            f"    acc{x} = fma(w{ky * win.kw + kx}, v{x * win.sw + kx * win.dw}, acc{x});\n"
            for x in range(vx)
            for kx in range(win.kw)
        )
        body += f"  if ((uint)(iy0 + {ky * win.dh}) < {win.h}u) {{\n"
        body += f"    __global const float* row = b + (iy0 + {ky * win.dh}) * {win.w};\n{loads}{fmas}  }}\n"
    params = ""
    for x in range(vx):
        stmts, res, params = _epi(r, epi, f"acc{x}", f"bz * {spec.n} + j", "    ", idx, coords)
        guard = "" if ow % vx == 0 else f"if (ox0 + {x} < {ow}) "
        body += f"  {guard}{{\n    const int j = oy * {ow} + ox0 + {x};\n{stmts}    c[j] = {res};\n  }}\n"
    src = f"""/* KERNEL_NAME */
__kernel __attribute__((reqd_work_group_size(128, 1, 1))) void KERNEL_NAME(__global float* restrict C, __global const float* restrict A, __global const float* restrict B{params}) {{
  const {idx} g = get_global_id(0);
  if (g >= {total}) return;
  const {idx} bz = g / {oh * segs};
  const int q = (int)(g % {oh * segs}), oy = q / {segs}, ox0 = q % {segs} * {vx};
  const int iy0 = oy * {win.sh} - {win.ph}, ix0 = ox0 * {win.sw} - {win.pw};
{_cl_operands(spec)}{body}}}
"""
    return _finish("GEMV", spec, src, (-(-total // 128) * 128,), (128,))


def _render_columns(spec: GemmSpec, r: Any, epi: Epilogue | None) -> RenderedKernel:
    m, n, k = spec.m, spec.n, spec.k
    _, _, sam, sak = spec.a
    _, _, sbk, sbn = spec.b
    stmts, res, params = _epi(r, epi, "acc[i]", f"bz * {m * n}L + (long)i * {n} + j", "    ")
    if spec.conv is not None:  # a depthwise or few-filter convolution: taps gathered from the image
        decls, value = conv_gather(spec, "p", "j", "1")
        load = f"float bv; {{ {decls} bv = {value}; }}"
    else:
        load = f"const float bv = b[(long)p * {sbk} + (long)j * {sbn}];"
    src = f"""/* KERNEL_NAME */
__kernel __attribute__((reqd_work_group_size(64, 1, 1))) void KERNEL_NAME(__global float* restrict C, __global const float* restrict A, __global const float* restrict B{params}) {{
  const int j = get_global_id(0);
  const long bz = get_global_id(1);
  if (j >= {n}) return;
{_cl_operands(spec)}  float acc[{m}];
  for (int i = 0; i < {m}; i++) acc[i] = 0.0f;
  for (int p = 0; p < {k}; p++) {{
    {load}
    for (int i = 0; i < {m}; i++) acc[i] = fma(a[(long)i * {sam} + (long)p * {sak}], bv, acc[i]);
  }}
  for (int i = 0; i < {m}; i++) {{
{stmts}    C[bz * {m * n}L + (long)i * {n} + j] = {res};
  }}
}}
"""
    return _finish("GEMV", spec, src, (-(-n // 64) * 64, spec.batch), (64, 1))


def _render_k_contiguous(spec: GemmSpec, r: Any, epi: Epilogue | None) -> RenderedKernel:
    m, n, k = spec.m, spec.n, spec.k
    ao, sab, sam, sak = spec.a
    bo, sbb, _, sbn = spec.b
    vec = all(v % 4 == 0 for v in (k, ao, sab, sam, bo, sbb, sbn, spec.a_inner, spec.b_inner)) and sak == 1
    cpg = COLS_PER_GROUP
    if vec:
        loop = f"""  for (int p = lane * 4; p < {k}; p += 128) {{
    const float4 bv = vload4(0, bj + p);
    for (int i = 0; i < {m}; i++) acc[i] += dot(vload4(0, a + (long)i * {sam} + p), bv);
  }}"""
    else:
        loop = f"""  for (int p = lane; p < {k}; p += 32) {{
    const float bv = bj[p];
    for (int i = 0; i < {m}; i++) acc[i] = fma(a[(long)i * {sam} + (long)p * {sak}], bv, acc[i]);
  }}"""
    stmts, res, params = _epi(r, epi, "v", f"bz * {m * n}L + (long)i * {n} + j", "    ")
    src = f"""/* KERNEL_NAME */
__kernel __attribute__((reqd_work_group_size(32, {cpg}, 1))) void KERNEL_NAME(__global float* restrict C, __global const float* restrict A, __global const float* restrict B{params}) {{
  const int lane = get_local_id(0), col = get_local_id(1), j = get_group_id(0) * {cpg} + col;
  const long bz = get_global_id(2);
  __local float red[{cpg}][{m}][33];
{_cl_operands(spec)}  float acc[{m}];
  for (int i = 0; i < {m}; i++) acc[i] = 0.0f;
  if (j < {n}) {{
    __global const float* bj = b + (long)j * {sbn};
{loop}
  }}
  for (int i = 0; i < {m}; i++) red[col][i][lane] = acc[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (lane < {m} && j < {n}) {{
    const int i = lane;
    float v = 0.0f;
    for (int l = 0; l < 32; l++) v += red[col][i][l];
{stmts}    C[bz * {m * n}L + (long)i * {n} + j] = {res};
  }}
}}
"""
    return _finish("GEMV", spec, src, (-(-n // cpg) * 32, cpg, spec.batch), (32, cpg, 1))
