"""An image stem and the max pool that alone reads it, as one cpu kernel (inference).

resnet's 7x7/2 stem wrote 64 x 112 x 112 floats per image (3.2 MB, more than L2) through transposes to its
NCHW planes, and the 3x3/2 pool after it read them back from memory; alexnet's 11x11/4 stem and its 3x3/2 pool
likewise. Here the stems' lanes form (plait/codegen/gemm_c.py: `plait_dc_band`, `plait_dl_micro`,
`plait_dl_store`) computes each conv row into a row tile (VW-channel groups, pixel-major), applies the stem's
epilogue there (per-channel operands only: bias, folded batch norm, ReLU), and the pool takes its maxima over
whole channel vectors of those tiles while they are in cache (first along the row, then across the window's
rows); only the pooled rows are transposed and stored.
Tasks are bands of up to POOL_ROWS pooled rows of one image (band_rows balances two threads; SCHEDULE hands them
out); a thread keeps the conv rows its previous band computed, so the rows two bands share are computed once per
thread, not once per band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from plait.codegen import gemm_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.codegen.gemm import Epilogue, GemmSpec, _epi, _finish, _tile_coords
from plait.codegen.pointwise_c import LanesPlan
from plait.codegen.pool_c import PoolGeometry

POOL_ROWS = 4  # most pooled rows per task (resnet b1: 14 tasks, so both threads get 7)
THREADS = gemm_c.PRICED_THREADS  # the threads whose rows band_rows balances (gemm_c.PRICED_THREADS)
# the bands' OpenMP schedule. The stem is a replay's first step and waits at no barrier, but after an idle pause the
# team's second thread (asleep, OMP_WAIT_POLICY=PASSIVE) joins it 0.8-1.4 ms late on the Zen 5 KVM guest: under a
# static split the first thread then waited 0.9 ms at the next step's barrier; guided chunks (half the bands, then
# half the rest...) let it take the bands the other has not reached, and stay contiguous when both start together.
# resnet18 b1 two threads, a 0.2 s sleep before each replay: 12.80 -> 11.42, 10.44 -> 10.36, 10.18 -> 9.57 ms; alexnet
# 9.10 -> 8.61; back to back 7.32 -> 7.32 and 6.45 -> 6.43; resnet18 b16 97.13 -> 97.08 (medians, one process)
SCHEDULE = "guided"
# bytes of packed weights per pass of the fused stem: resnet's 147 x 64 weights (37.6 KB) in one pass instead of the
# lanes forms' two (gemm_c.DIRECT_LANES_KC_BYTES, 24 KB: each row tile's partial sums stored and read back once more).
# Zen 5 guest, one thread, fewest thread CPU of 30 (bench_gemm_knobs_ab.py, against 24577 bytes, which passes as 24 KB
# does in a library of its own): resnet50's stem 1.227 -> 1.198 ms, alexnet's (k 363, 4 -> 3 passes) 0.687 -> 0.672;
# 64 KB 1.200 / 0.698, 96 KB 1.195 / 0.693. Two threads, resnet50 b1 replays (bench_far_ab.py, near placement, 20
# windows): the stem's step 0.698 -> 0.664 ms, whole replays 19.03 -> 19.00 (docs/benchmarks.md)
STEM_KC_BYTES = 40960


def band_rows(batch: int, rows: int) -> int:
    """Pooled rows per task: the most (up to POOL_ROWS) that leave the busier of THREADS threads the fewest rows
    under OpenMP's static split into contiguous chunks. alexnet b1's 27 pooled rows in bands of 4 are 7 tasks, so
    one thread ran 16 rows and the other 11; bands of 2 give 14 and 13. Larger bands share fewer conv rows between
    threads and pack the image's input rows in fewer, longer runs."""

    def busiest(pb: int) -> int:
        bands = -(-rows // pb)
        return gemm_c.static_busiest([min(pb, rows - task % bands * pb) for task in range(batch * bands)], THREADS)

    return min(range(POOL_ROWS, 0, -1), key=busiest)


def fits(spec: GemmSpec, epi: Epilogue | None, g: PoolGeometry) -> bool:
    """Whether stem `spec` (with epilogue `epi`) and the max pool `g` over its output run as one kernel: the stem
    runs in the lanes form (gemm_c.direct_lanes) over whole images (no groups), the pool reads exactly its output,
    and the epilogue reads only per-channel operands (it runs on channel vectors, before the pool)."""
    win = spec.conv
    if win is None or win.fold or spec.a_nchw is not None:
        return False
    if not gemm_c.use_direct(win, spec.m, spec.k) or gemm_c.direct_lanes(win, spec.m, spec.k) is None:
        return False
    if (g.n, g.c, g.h * g.w, g.w) != (spec.batch, spec.m, spec.n, win.ow):
        return False
    return epi is None or _per_channel(epi, spec.batch, spec.m, spec.n)


def _per_channel(epi: Epilogue, batch: int, m: int, n: int) -> bool:
    """Whether every operand of `epi` other than the product is constant over an image's pixels and images: reached
    through an expand of a (1, m, 1, 1)-like or one-element node, so a channel vector can be given the epilogue."""
    shape = epi.root.shape
    if _tile_coords(shape, batch, m, n) is None:
        return False
    todo, seen = [epi.root], set()
    while todo:
        x = todo.pop()
        if x.uid in seen or x.uid == epi.mm.uid:
            continue
        seen.add(x.uid)
        if math.prod(x.shape) == 1:
            continue
        if x.op == "expand" and _channel_only(x.srcs[0].shape, m):
            continue
        if x.shape != shape or x.buffer is not None:
            return False
        todo.extend(x.srcs)
    return True


def _channel_only(shape: tuple[int, ...], m: int) -> bool:
    """A shape that broadcasts to (N, m, H, W) along its channel axis only: (1, m, 1, 1) or (1, 1, 1, 1)-like."""
    return len(shape) == 4 and shape[0] == 1 and shape[1] in (1, m) and shape[2:] == (1, 1)


@dataclass(frozen=True)
class StemPool:
    """What the fused kernel's renderer needs: the stem's product, its epilogue (or None) and the pool."""

    spec: GemmSpec
    epi: Epilogue | None
    pool: PoolGeometry
    packed: bool = False  # A is the weights packed at plan build (pack_plan), not the stem's weight rows


def packable(spec: GemmSpec) -> bool:
    """Whether one set of weights serves every image (no batch strides), so they can be packed once."""
    return spec.a[1] == 0 and spec.a_inner == 0


def pack_plan(spec: GemmSpec) -> LanesPlan:
    """The packing of the stem's weights that the kernel reads when StemPool.packed: panels of the lanes tile's
    VW*CV output channels over all k patch elements (the layout the kernel otherwise builds per call and thread),
    made by a `pointwise_weight` node that runs once, when the plan is built."""
    win = spec.conv
    assert win is not None
    tile = gemm_c.direct_lanes(win, spec.m, spec.k)
    assert tile is not None
    ao, _, sam, sak = spec.a
    return LanesPlan(spec.m, spec.k, tile[1], tile[0], (ao, sam, sak))


DRIVER = """//@shared-begin plait_conv_dlpool_@CV@x@PX@
typedef void (*plait_epl_fn)(float* t, long bz, int m, int tw, int np, void* const* extra);
typedef struct { int kh, kw, sh, sw, ph, pw, dh, dw, oh, ow, pb; } plait_pwin; /* pb: pooled rows per task */

/* NaN wins and then stays, as in PyTorch; where no operand holds a NaN the plain maximum gives the same bits (one
   instruction per vector instead of four), so the passes test their rows once and take it there. */
#define PLAIT_MAX_NAN(o, v) (((o) > (v) || (o) != (o)) ? (o) : (v))
#define PLAIT_MAX(o, v) ((o) > (v) ? (o) : (v))

/* h (PLAIT_VW-channel groups of PTW pooled columns, pixel-major) = the maxima of conv row tile t (groups of TW
   pixels, ow of them in use) over the pool's window columns, the columns whose windows lie inside the row without bounds
   tests. Returns whether t may hold a NaN (it holds a NaN or an infinity). */
static int plait_pool_row(const float* restrict t, const plait_pwin* pg, int m, int TW, int ow, int PTW,
                          float* restrict h) {
  /* x * 0 is NaN for a NaN or an infinity, else 0: one multiply-add per vector tests the row, into four sums. One
     chain of dependent multiply-adds waited for each: resnet50's stem 1.233-1.249 -> 1.194-1.203 ms with four, one
     thread, against controls (alexnet's 0.678-0.683 -> 0.673-0.677) */
  plait_vf z[4] = {{0}, {0}, {0}, {0}};
  for (int cg = 0; cg < m / PLAIT_VW; cg++) {
    const plait_vf* r = (const plait_vf*)(t + (long)cg * TW * PLAIT_VW);
    int v = 0;
    for (; v + 4 <= ow; v += 4)
#pragma GCC unroll 4
      for (int q = 0; q < 4; q++) z[q] += r[v + q] * 0.0f;
    for (; v < ow; v++) z[0] += r[v] * 0.0f;
  }
  plait_vf zs = (z[0] + z[1]) + (z[2] + z[3]);
  int nan = 0, sw = pg->sw, dw = pg->dw, kw = pg->kw;
  for (int i = 0; i < PLAIT_VW; i++) nan |= zs[i] != zs[i];
  /* pooled columns [lo, hi) have every window column inside the row */
  int lo = (pg->pw + sw - 1) / sw, last = ow - 1 - (kw - 1) * dw + pg->pw;
  int hi = last < 0 ? 0 : last / sw + 1;
  hi = hi > pg->ow ? pg->ow : hi;
  lo = lo > hi ? hi : lo;
  for (int cg = 0; cg < m / PLAIT_VW; cg++) {
    const float* r = t + (long)cg * TW * PLAIT_VW;
    float* d = h + (long)cg * PTW * PLAIT_VW;
    for (int px = 0; px < pg->ow; px++) {
      float* restrict o = d + (long)px * PLAIT_VW;
      int x0 = px * sw - pg->pw;
      if (px >= lo && px < hi && !nan) {
        const float* restrict s = r + (long)x0 * PLAIT_VW;
#pragma omp simd
        for (int i = 0; i < PLAIT_VW; i++) {
          float v = s[i];
          for (int kx = 1; kx < kw; kx++) v = PLAIT_MAX(v, s[kx * dw * PLAIT_VW + i]);
          o[i] = v;
        }
        continue;
      }
      for (int i = 0; i < PLAIT_VW; i++) o[i] = -INFINITY;
      for (int kx = 0; kx < kw; kx++) {
        int x = x0 + kx * dw;
        if (x < 0 || x >= ow) continue;
        const float* restrict s = r + (long)x * PLAIT_VW;
#pragma omp simd
        for (int i = 0; i < PLAIT_VW; i++) o[i] = PLAIT_MAX_NAN(o[i], s[i]);
      }
    }
  }
  return nan;
}

/* P[bz] (m x poh x pow) = the max pool pg of epl(the convolution of image bz with A's rows), as tasks of PB =
   pg->pb pooled rows of one image. A task computes the conv rows its windows read that this thread does not hold
   yet from its band of input rows, each as plait_conv_dlanes does into a row tile that epl then finishes;
   plait_pool_row keeps the row's maxima over the window columns (row y in slot y % NS of NS), and each pooled row
   is the maximum of its window rows' slots, stored to P's planes transposed PLAIT_VW x PLAIT_VW at a time. With
   pre, A holds the weights already packed as panels of CW channels (pack_plan); else each thread packs them from A's
   rows. */
static void plait_conv_dlpool_@CV@x@PX@(long batch, long inner, int m, int n, int k, const float* A, int pre,
                                      long sab, long sai, long sam, const float* X, long sxb, long sxi, const plait_win* g,
                                      const plait_pwin* pg, float* P, plait_epl_fn epl, void* const* extra) {
  enum { CV = @CV@, PX = @PX@, L = PLAIT_VW, CW = CV * L };
  int PB = pg->pb;
  int ow = g->ow, oh = n / ow, kk = g->kh * g->kw, cin = k / kk, sw = g->sw, mb = m / CW;
  int passes = (int)(((long)k * CW * 4 + @KCB@ - 1) / @KCB@), kc = (k + passes - 1) / passes;
  int TW = ((ow + PX - 1) / PX * PX + L - 1) / L * L, PTW = (pg->ow + L - 1) / L * L;
  int NS = (PB - 1) * pg->sh + (pg->kh - 1) * pg->dh + 1;
  int R = (NS - 1) * g->sh + (g->kh - 1) * g->dh + 1, T = TW + (g->kw - 1) * g->dw / sw;
  long pn = (long)pg->oh * pg->ow, bands = (pg->oh + PB - 1) / PB;
  size_t nbuf = ((size_t)cin * R * sw * T + 15) / 16 * 16, nw = (size_t)m * k, nrow = (size_t)m * TW;
  float* buf = plait_scratch(nbuf + nw + nrow + (size_t)m * PTW * (NS + 1) + (size_t)k + (size_t)NS);
  float* w = buf + nbuf;
  float* slots = w + nw;
  float* rows = slots + nrow;
  float* pt = rows + (size_t)m * PTW * NS;
  int* koff = (int*)(pt + (size_t)m * PTW);
  int* hnan = koff + k; /* whether slot's conv row held a NaN */
  const float* packed = 0;
  long have_bz = -1;
  int have_lo = 0, have_hi = 0; /* the slots hold conv rows [have_lo, have_hi) of image have_bz */
  plait_dc_offsets(g, k, R, T, koff);
#pragma omp for schedule(@SCHED@) nowait
  for (long task = 0; task < batch * bands; task++) {
    long bz = task / bands;
    int py0 = (int)(task % bands) * PB, prows = pg->oh - py0 < PB ? pg->oh - py0 : PB;
    int lo = py0 * pg->sh - pg->ph, hi = (py0 + prows - 1) * pg->sh - pg->ph + (pg->kh - 1) * pg->dh + 1;
    lo = lo < 0 ? 0 : lo;
    hi = hi > oh ? oh : hi;
    const float* a = A + bz / inner * sab + bz % inner * sai;
    if (pre) {
      w = (float*)A; /* packed at plan build: the kernel only reads it */
    } else if (a != packed) {
      for (int b = 0; b < mb; b++)
        for (int p = 0; p < k; p++)
          for (int i = 0; i < CW; i++) w[((long)b * k + p) * CW + i] = a[(long)(b * CW + i) * sam + p];
      packed = a;
      have_bz = -1;
    }
    int c0 = have_bz == bz && have_lo <= lo && lo <= have_hi && have_hi <= hi ? have_hi : lo;
    if (c0 < hi) {
      plait_dc_band(X + bz / inner * sxb + bz % inner * sxi, g, cin, c0 * g->sh, (hi - c0 - 1) * g->sh + (g->kh - 1) * g->dh + 1, R, T, buf);
      for (int y = c0; y < hi; y++) {
        const float* src = buf + (long)(y - c0) * g->sh * sw * T;
        float* tile = slots;
        for (int b = 0; b < mb; b++)
          for (int p0 = 0; p0 < k; p0 += kc)
            for (int x0 = 0; x0 < ow; x0 += PX)
              plait_dl_micro_@CV@x@PX@(p0, p0 + kc < k ? p0 + kc : k, koff, src + x0, w + (long)b * k * CW,
                                       tile + ((long)b * CV * TW + x0) * L, (long)TW * L);
        if (epl) epl(tile, bz, m, TW, ow, extra);
        hnan[y % NS] = plait_pool_row(tile, pg, m, TW, ow, PTW, rows + (size_t)(y % NS) * m * PTW);
      }
    }
    have_lo = c0 == lo ? lo : have_lo;
    have_lo = have_lo < hi - NS ? hi - NS : have_lo; /* older rows' slots now hold newer rows */
    have_hi = hi;
    have_bz = bz;
    float* p = P + bz * (long)m * pn;
    for (int py = py0; py < py0 + prows; py++) {
      int y0 = py * pg->sh - pg->ph, nan = 0;
      for (long e = 0; e < (long)m * PTW; e++) pt[e] = -INFINITY;
      for (int ky = 0; ky < pg->kh; ky++) {
        int y = y0 + ky * pg->dh;
        if (y < 0 || y >= oh) continue;
        const float* restrict h = rows + (size_t)(y % NS) * m * PTW;
        if (nan || hnan[y % NS]) {
          nan = 1;
#pragma omp simd
          for (long e = 0; e < (long)m * PTW; e++) pt[e] = PLAIT_MAX_NAN(pt[e], h[e]);
        } else {
#pragma omp simd
          for (long e = 0; e < (long)m * PTW; e++) pt[e] = PLAIT_MAX(pt[e], h[e]);
        }
      }
      for (int cg = 0; cg < m / L; cg++)
        for (int x0 = 0; x0 < pg->ow; x0 += L)
          plait_dl_store(pt + ((long)cg * PTW + x0) * L, p + (long)cg * L * pn + (long)py * pg->ow + x0, pn,
                         pg->ow - x0 < L ? pg->ow - x0 : L);
    }
  }
}
//@shared-end
"""


def library(cv: int, px: int) -> str:
    """The shared C code of the fused stem and pool for a cv x px register tile."""
    body = DRIVER.replace("@CV@", str(cv)).replace("@PX@", str(px))
    body = body.replace("@KCB@", str(STEM_KC_BYTES)).replace("@SCHED@", SCHEDULE)
    base = gemm_c.at_o2(gemm_c.COMMON) + gemm_c.at_o2(gemm_c.DIRECT_BAND)
    return base + gemm_c.lanes_blocks(cv, px) + gemm_c.at_o2(body)


def render(sp: StemPool, r: Any) -> RenderedKernel:
    """The C kernel of the fused stem and pool: C is the pooled output, A the stem's weights (packed when sp.packed), B the image, then the
    epilogue's operands."""
    spec, g, win = sp.spec, sp.pool, sp.spec.conv
    assert win is not None
    tile = gemm_c.direct_lanes(win, spec.m, spec.k)
    assert tile is not None
    epl_fn, extra, epilogue, holder, params = "0", "0", "", "", ""
    if sp.epi is not None:
        coords = _tile_coords(sp.epi.root.shape, spec.batch, spec.m, spec.n, "(cg * PLAIT_VW + i)", "0")
        stmts, res, params = _epi(r, sp.epi, "v", "0", "      ", "int", coords)
        loads = "".join(
            f"  const {r.storage_type(x.dtype)}* restrict e{i} = extra[{i}];\n" for i, x in enumerate(sp.epi.extra)
        )
        epl_fn, extra = "epl_KERNEL_NAME", "extra"
        epilogue = f"""static void epl_KERNEL_NAME(float* restrict t, long bz, int m, int tw, int np, void* const* extra) {{
{loads}  for (int cg = 0; cg < m / PLAIT_VW; cg++)
    for (int j = 0; j < np; j++) {{
      float* restrict c = t + ((long)cg * tw + j) * PLAIT_VW;
#pragma omp simd
      for (int i = 0; i < PLAIT_VW; i++) {{
      float v = c[i];
{stmts}      c[i] = {res};
      }}
    }}
}}
"""
        holder = f"  void* const extra[] = {{{', '.join(f'(void*)e{i}' for i in range(len(sp.epi.extra))) or '0'}}};\n"
    pgeo = (
        f"{g.kh}, {g.kw}, {g.sh}, {g.sw}, {g.ph}, {g.pw}, {g.dh}, {g.dw}, {g.oh}, {g.ow}, {band_rows(spec.batch, g.oh)}"
    )
    ao, sab, sam, _ = spec.a
    bo, sbb, _, _ = spec.b
    call = (
        f"{gemm_c.win_decl(win)}"
        f"  static const plait_pwin pwin = {{{pgeo}}};\n"
        f"  plait_conv_dlpool_{tile[0]}x{tile[1]}({spec.batch}, {spec.inner}, {spec.m}, {spec.n}, {spec.k}, "
        f"{'A, 1' if sp.packed else f'A + {ao}, 0'}, {sab}, {spec.a_inner}, {sam}, B + {bo}, {sbb}, {spec.b_inner}, &win, &pwin, C, {epl_fn}, {extra});\n"
    )
    args = ["float* restrict C", "const float* restrict A", "const float* restrict B", *params.split(", ")[1:]]
    src = entry_points("KERNEL_NAME", args, holder + call, f"{library(*tile)}/* KERNEL_NAME */\n{epilogue}")
    return _finish("STEMPOOL", spec, src, (1,), None)
