"""GEMM templates with tunable knobs: one for C (packed panels, a register-blocked vector micro-kernel, OpenMP)
and one for OpenCL (local-memory tiles, register blocking per work-item).

Operands are strided views: A[b, m, k] = a[a_off + b*sab + m*sam + k*sak], likewise B; C is contiguous
(batch, M, N). Transposes and broadcast batch dims therefore cost no copy.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from plait.codegen.cstyle import RenderedKernel
from plait.codegen.expr import ExprBuilder, Idx
from plait.graph.node import Node


@dataclass(frozen=True)
class GemmSpec:
    batch: int
    m: int
    n: int
    k: int
    a: tuple[int, int, int, int]  # offset, batch stride, m stride, k stride
    b: tuple[int, int, int, int]  # offset, batch stride, k stride, n stride

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class Epilogue:
    """An elementwise expression `root` applied to each product element (node `mm`) before it is stored; it may
    read `extra` buffers at the same element (bias, residual, BN scale/shift)."""

    root: Node
    mm: Node
    extra: tuple[Node, ...]


def _epi(r: Any, epi: Epilogue | None, value: str, index: str, indent: str) -> tuple[str, str, str]:
    """(statements, result expression, extra kernel parameters) for storing `value` at linear `index`."""
    if epi is None:
        return "", value, ""
    args = {n.uid: f"e{i}" for i, n in enumerate(epi.extra)}
    b = ExprBuilder(r, args, "long", subst={epi.mm.uid: value})
    v = b.value(epi.root, Idx(epi.root.shape, linear=b.tmp("long", index, "i")))
    params = "".join(", " + r.param(n.dtype, f"e{i}", False) for i, n in enumerate(epi.extra))
    return "".join(f"{indent}{ln}\n" for ln in b.lines), v, params


C_DEFAULT = {"MR": 6, "NR": 64, "KC": 256, "VW": 16}
CL_DEFAULT = {"TSM": 64, "TSN": 64, "TSK": 16, "WPTM": 4, "WPTN": 4}


def _finish(kind: str, spec: GemmSpec, src: str, gs: tuple[int, ...], ls: tuple[int, ...] | None) -> RenderedKernel:
    digest = hashlib.sha256(src.encode()).hexdigest()[:10]
    name = f"{kind}_{spec.batch}x{spec.m}x{spec.n}x{spec.k}_{digest}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), gs, ls)


def _render_c_small(spec: GemmSpec, r: Any, epi: Epilogue | None) -> RenderedKernel:
    """Few rows (a batch-1 linear layer): stream B once with no packing, as dot products along a contiguous k
    (B = W^T of a row-major weight) or as row updates along a contiguous n."""
    ao, sab, sam, sak = spec.a
    bo, sbb, sbk, sbn = spec.b
    m, n, k = spec.m, spec.n, spec.k
    idx = f"bz * {m * n}L + (long)i * {n} + j"
    if sbk == 1:
        stmts, res, params = _epi(r, epi, "acc", idx, "        ")
        body = f"""#pragma omp parallel for schedule(static)
    for (int j = 0; j < {n}; j++) {{
      const float* bj = b + (long)j * {sbn};
      for (int i = 0; i < {m}; i++) {{
        const float* ai = a + (long)i * {sam};
        float acc = 0.0f;
#pragma omp simd reduction(+:acc)
        for (int p = 0; p < {k}; p++) acc += ai[(long)p * {sak}] * bj[p];
{stmts}        c[(long)i * {n} + j] = {res};
      }}
    }}"""
    else:
        stmts, res, params = _epi(r, epi, "acc[j - j0]", idx, "          ")
        body = f"""#pragma omp parallel for schedule(static)
    for (int j0 = 0; j0 < {n}; j0 += 256) {{
      int j1 = j0 + 256 < {n} ? j0 + 256 : {n};
      for (int i = 0; i < {m}; i++) {{
        float acc[256] = {{0}};
        for (int p = 0; p < {k}; p++) {{
          float av = a[(long)i * {sam} + (long)p * {sak}];
          const float* bp = b + (long)p * {sbk};
#pragma omp simd
          for (int j = j0; j < j1; j++) acc[j - j0] += av * bp[(long)j * {sbn}];
        }}
        for (int j = j0; j < j1; j++) {{
{stmts}          c[(long)i * {n} + j] = {res};
        }}
      }}
    }}"""
    src = f"""void KERNEL_NAME(float* restrict C, const float* restrict A, const float* restrict B{params}) {{
  for (long bz = 0; bz < {spec.batch}; bz++) {{
    const float* a = A + {ao} + bz * {sab}L;
    const float* b = B + {bo} + bz * {sbb}L;
    float* c = C + bz * {m * n}L;
    {body}
  }}
}}
"""
    return _finish("GEMV", spec, src, (1,), None)


def render_c(spec: GemmSpec, knobs: dict[str, int] | None = None, r: Any = None, epi: Epilogue | None = None) -> RenderedKernel:
    kn = {**C_DEFAULT, **(knobs or {})}
    if spec.m <= kn.get("SMALL_M", 4):
        return _render_c_small(spec, r, epi)
    mr, nr, kc, vw = kn["MR"], kn["NR"], kn["KC"], kn["VW"]
    nv = nr // vw
    ao, sab, sam, sak = spec.a
    bo, sbb, sbk, sbn = spec.b
    m, n, k = spec.m, spec.n, spec.k
    mp, np_ = -(-m // mr) * mr, -(-n // nr) * nr
    stmts, res, params = _epi(r, epi, "v", f"bz * {m * n}L + (long)(i0 + i) * {n} + j0 + j", "                ")
    epilogue = ""
    if epi is not None:  # after the last k block, while the tile is still in cache
        epilogue = f"""
            if (pc + kc >= {k}) {{
              for (int i = 0; i < mr; i++) for (int j = 0; j < nr; j++) {{
                float v = c[(long)(i0 + i) * {n} + j0 + j];
{stmts}                c[(long)(i0 + i) * {n} + j0 + j] = {res};
              }}
            }}"""
    src = f"""/* KERNEL_NAME */
#include <stdlib.h>
#include <string.h>
typedef float vf __attribute__((vector_size({vw * 4})));
#define MR {mr}
#define NR {nr}
#define NV {nv}
#define KC {kc}

static void micro_KERNEL_NAME(int kc, const float* restrict ap, const float* restrict bp, float* restrict c, int mr, int nr, int first) {{
  vf acc[MR][NV];
  for (int i = 0; i < MR; i++) for (int v = 0; v < NV; v++) acc[i][v] = (vf){{0}};
  for (int p = 0; p < kc; p++) {{
    vf b[NV];
    for (int v = 0; v < NV; v++) b[v] = *(const vf*)(bp + p * NR + v * {vw});
#pragma GCC unroll {mr}
    for (int i = 0; i < MR; i++) {{
      float a = ap[p * MR + i];
      for (int v = 0; v < NV; v++) acc[i][v] += b[v] * a;
    }}
  }}
  if (mr == MR && nr == NR) {{
    for (int i = 0; i < MR; i++) for (int v = 0; v < NV; v++) {{
      vf old;
      if (first) old = (vf){{0}}; else memcpy(&old, c + i * {n} + v * {vw}, sizeof(vf));
      old += acc[i][v];
      memcpy(c + i * {n} + v * {vw}, &old, sizeof(vf));
    }}
  }} else {{
    for (int i = 0; i < mr; i++) for (int j = 0; j < nr; j++) {{
      float x = acc[i][j / {vw}][j % {vw}];
      c[i * {n} + j] = first ? x : c[i * {n} + j] + x;
    }}
  }}
}}

void KERNEL_NAME(float* restrict C, const float* restrict A, const float* restrict B{params}) {{
  float* bp = aligned_alloc(64, sizeof(float) * KC * {np_});
  float* ap = aligned_alloc(64, sizeof(float) * KC * {mp});
  for (long bz = 0; bz < {spec.batch}; bz++) {{
    const float* a = A + {ao} + bz * {sab}L;
    const float* b = B + {bo} + bz * {sbb}L;
    float* c = C + bz * {m * n}L;
    for (int pc = 0; pc < {k}; pc += KC) {{
      int kc = {k} - pc < KC ? {k} - pc : KC;
#pragma omp parallel
      {{
#pragma omp for schedule(static) nowait
        for (int j0 = 0; j0 < {np_}; j0 += NR)
          for (int p = 0; p < kc; p++)
            for (int j = 0; j < NR; j++)
              bp[j0 * kc + p * NR + j] = j0 + j < {n} ? b[(long)(pc + p) * {sbk} + (long)(j0 + j) * {sbn}] : 0.0f;
#pragma omp for schedule(static)
        for (int i0 = 0; i0 < {mp}; i0 += MR)
          for (int p = 0; p < kc; p++)
            for (int i = 0; i < MR; i++)
              ap[i0 * kc + p * MR + i] = i0 + i < {m} ? a[(long)(i0 + i) * {sam} + (long)(pc + p) * {sak}] : 0.0f;
#pragma omp for collapse(2) schedule(static)
        for (int j0 = 0; j0 < {np_}; j0 += NR)
          for (int i0 = 0; i0 < {mp}; i0 += MR) {{
            int mr = {m} - i0 < MR ? {m} - i0 : MR;
            int nr = {n} - j0 < NR ? {n} - j0 : NR;
            micro_KERNEL_NAME(kc, ap + i0 * kc, bp + j0 * kc, c + (long)i0 * {n} + j0, mr, nr, pc == 0);{epilogue}
          }}
      }}
    }}
  }}
  free(ap);
  free(bp);
}}
#undef MR
#undef NR
#undef NV
#undef KC
"""
    return _finish("GEMM", spec, src, (1,), None)


def render_opencl(spec: GemmSpec, knobs: dict[str, int] | None = None, r: Any = None, epi: Epilogue | None = None) -> RenderedKernel:
    kn = {**CL_DEFAULT, **(knobs or {})}
    tsm, tsn, tsk, wm, wn = kn["TSM"], kn["TSN"], kn["TSK"], kn["WPTM"], kn["WPTN"]
    rm, rn = tsm // wm, tsn // wn
    nt = rm * rn
    ao, sab, sam, sak = spec.a
    bo, sbb, sbk, sbn = spec.b
    m, n, k = spec.m, spec.n, spec.k
    a_map = "int mm = l / TSK, kk = l % TSK;" if sak == 1 else "int kk = l / TSM, mm = l % TSM;"
    b_map = "int kk = l / TSN, nn = l % TSN;" if sbn == 1 else "int nn = l / TSK, kk = l % TSK;"
    stmts, res, params = _epi(r, epi, "acc[i][j]", f"bz * {m * n}L + (long)gm * {n} + gn", "        ")
    src = f"""/* KERNEL_NAME */
#define TSM {tsm}
#define TSN {tsn}
#define TSK {tsk}
#define WPTM {wm}
#define WPTN {wn}
#define RTSM {rm}
#define RTSN {rn}
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1))) void KERNEL_NAME(__global float* restrict C, __global const float* restrict A, __global const float* restrict B{params}) {{
  const int tn = get_local_id(0), tm = get_local_id(1);
  const int tid = tm * RTSN + tn;
  const int n0 = get_group_id(0) * TSN, m0 = get_group_id(1) * TSM;
  const long bz = get_global_id(2);
  __global const float* a = A + {ao} + bz * {sab}L;
  __global const float* b = B + {bo} + bz * {sbb}L;
  __global float* c = C + bz * {m * n}L;
  __local float As[TSK][TSM];
  __local float Bs[TSK][TSN];
  float acc[WPTM][WPTN];
  for (int i = 0; i < WPTM; i++) for (int j = 0; j < WPTN; j++) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < {k}; k0 += TSK) {{
    for (int l = tid; l < TSK * TSM; l += {nt}) {{
      {a_map}
      int gm = m0 + mm, gk = k0 + kk;
      As[kk][mm] = (gm < {m} && gk < {k}) ? a[(long)gm * {sam} + (long)gk * {sak}] : 0.0f;
    }}
    for (int l = tid; l < TSK * TSN; l += {nt}) {{
      {b_map}
      int gn = n0 + nn, gk = k0 + kk;
      Bs[kk][nn] = (gn < {n} && gk < {k}) ? b[(long)gk * {sbk} + (long)gn * {sbn}] : 0.0f;
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < TSK; kk++) {{
      float br[WPTN];
      for (int j = 0; j < WPTN; j++) br[j] = Bs[kk][tn + j * RTSN];
      for (int i = 0; i < WPTM; i++) {{
        float av = As[kk][tm + i * RTSM];
        for (int j = 0; j < WPTN; j++) acc[i][j] = fma(av, br[j], acc[i][j]);
      }}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  for (int i = 0; i < WPTM; i++) {{
    int gm = m0 + tm + i * RTSM;
    if (gm >= {m}) continue;
    for (int j = 0; j < WPTN; j++) {{
      int gn = n0 + tn + j * RTSN;
      if (gn >= {n}) continue;
{stmts}      c[(long)gm * {n} + gn] = {res};
    }}
  }}
}}
#undef TSM
#undef TSN
#undef TSK
#undef WPTM
#undef WPTN
#undef RTSM
#undef RTSN
"""
    gs = (-(-n // tsn) * rn, -(-m // tsm) * rm, spec.batch)
    return _finish("GEMM", spec, src, gs, (rn, rm, 1))
