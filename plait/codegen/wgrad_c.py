"""The cpu weight gradient of a convolution as one product that gathers its patch rows from the image.

dW[co, r] = sum over images n and output positions q of dy[n, co, q] * X[n, r, q], where row r = (channel, ky, kx)
of the patch matrix X is a run of input rows (zero outside the image). Both operands run along the positions, so
the product is written as dot products along them: for a block of positions, a chunk of patch rows is gathered
from the image into a small buffer that stays in cache, dy's rows are read where they are (a block within one image
of a plane of whole vectors; else copied, padded with zeros), and a register tile of MR output-gradient rows by NC
patch rows accumulates lanes along the positions, summed once at the end. Reading dy in place saves a copy of it
per chunk of patch rows (twelve of a 128-channel 3x3 layer's): one thread, resnet18's layers at batch 16, the 56x56
one 51 -> 46 ms, the stem 66 -> 57-60 (benchmarks/conv_wgrad_direct_cpu.py's shapes).
Neither operand is transposed, so the im2col buffer of the folded form (C*kh*kw x N*P, written then read back) and
the copy of dy into an (N*P, Co) layout (the stem's 51 MB at batch 16) are not made. Few output tiles (a stem's
147 x 64) split the positions into parts summed afterwards, so every thread has work.
Stride-1 windows take a second form (plait_wgrad_s1): x and dy are copied once into rows padded by the window, so
that every patch row is x's padded plane at a fixed offset and the micro-kernel reads both operands in place, no
patch row gathered per chunk, at the cost of (kw - 1) * dw padded columns per output row (3.6% of a 56x56 plane,
29% of a 7x7 one).
"""

from __future__ import annotations

from typing import Any

from plait.codegen import gemm_c

VW = gemm_c.VW  # floats per vector register (plait/codegen/simd.py)
# Output-gradient rows x patch rows per register tile. AVX-512's 32 registers hold 24 accumulators; AVX2's 16 hold
# 12 with the MR + 1 operand vectors beside them (24 there spill to memory).
MR, NC = (4, 6) if VW == 16 else (2, 6)
# With fewer registers gcc folds each use of a patch row's vector into its FMA as a memory operand: the 2 x 6 tile
# then loads 14 vectors per 12 FMAs, more than the two a cycle a Zen 3 core takes. An empty asm statement keeps
# the vector in a register (8 loads per 12 FMAs): one thread, resnet18 b16's 56x56 layer 36-40 -> 53-60 GFLOP/s.
# AVX-512's tile is left as it was tuned.
KEEP_DEFINE = (
    ""
    if VW == 16
    else """
#if defined(__x86_64__)
#define PLAIT_WGRAD_KEEP(v) __asm__("" : "+x"(v)) /* v stays in a register, not refetched by every FMA */
#else
#define PLAIT_WGRAD_KEEP(v) (void)0
#endif"""
)
ROWS, COLS = 96, 128  # patch rows and output channels per task
KCW = 512  # positions per block: a task's buffers (patch rows, dy rows, partial sums) stay within L2


def _task_split() -> str:
    """Both forms' task count: rch x cch (row block, column block) tiles, each split into `parts` K parts (at most
    nkb, the k blocks) so that the team has about four tasks per thread."""
    return f"""  int rch = (nrow + {ROWS - 1}) / {ROWS}, cch = (co + {COLS - 1}) / {COLS};
  long base = (long)rch * cch, want = 4L * omp_get_num_threads();
  int parts = base >= want ? 1 : (int)((want + base - 1) / base);
  if (parts > nkb) parts = nkb;
"""


def _task_head() -> str:
    """The head of both forms' task loop: task t is K part s of the (row block, column block) tile it names, with
    that tile's bounds, padded sizes and k-block range."""
    return f"""#pragma omp for schedule(dynamic, 1)
  for (long t = 0; t < base * parts; t++) {{
    int s = (int)(t % parts), rc = (int)(t / parts / cch), cc = (int)(t / parts % cch);
    int r0 = rc * {ROWS}, r1 = r0 + {ROWS} < nrow ? r0 + {ROWS} : nrow;
    int c0 = cc * {COLS}, c1 = c0 + {COLS} < co ? c0 + {COLS} : co;
    int rows = (r1 - r0 + {NC - 1}) / {NC} * {NC}, cols = (c1 - c0 + {MR - 1}) / {MR} * {MR};
    int kb0 = (int)((long)s * nkb / parts), kb1 = (int)((long)(s + 1) * nkb / parts);
"""


def _keep(indent: int) -> str:
    """The line that keeps the micro-kernels' bv in a register where KEEP_DEFINE asks for it."""
    return " " * indent + "PLAIT_WGRAD_KEEP(bv);\n" if KEEP_DEFINE else ""


def _source() -> str:
    """The library's C source for the tile and block sizes above."""
    return f"""//@shared-begin plait_wgrad{KEEP_DEFINE}
/* acc[i][j] ({VW} lanes along the positions) += dy row i (at a + i * lda) . patch row j (at b + j * kcp) over kcp
   positions (a multiple of {VW}); the partial sums live in part between blocks. */
static inline __attribute__((always_inline)) void plait_wgrad_micro(int kcp, const float* restrict a, long lda,
                                                                   const float* restrict b, plait_vf* part, int first) {{
  plait_vf acc[{MR}][{NC}];
#pragma GCC unroll {MR}
  for (int i = 0; i < {MR}; i++)
#pragma GCC unroll {NC}
    for (int j = 0; j < {NC}; j++) acc[i][j] = first ? (plait_vf){{0}} : part[i * {NC} + j];
  for (int p = 0; p < kcp; p += {VW}) {{
    plait_vf av[{MR}];
#pragma GCC unroll {MR}
    for (int i = 0; i < {MR}; i++) av[i] = *(const plait_vf*)(a + i * lda + p);
#pragma GCC unroll {NC}
    for (int j = 0; j < {NC}; j++) {{
      plait_vf bv = *(const plait_vf*)(b + (long)j * kcp + p);
{_keep(6)}#pragma GCC unroll {MR}
      for (int i = 0; i < {MR}; i++) acc[i][j] += av[i] * bv;
    }}
  }}
#pragma GCC unroll {MR}
  for (int i = 0; i < {MR}; i++)
#pragma GCC unroll {NC}
    for (int j = 0; j < {NC}; j++) part[i * {NC} + j] = acc[i][j];
}}

/* A task's partial sums (row tiles of {NC} patch rows x column tiles of {MR} channels, {VW} lanes each) summed across
   their lanes into out (co x nrow), rows [r0, r1) and channels [c0, c1). */
static void plait_wgrad_store(const plait_vf* part, int rows, int cols, int r0, int r1, int c0, int c1, int nrow,
                              float* out) {{
  for (int rt = 0; rt < rows / {NC}; rt++)
    for (int ct = 0; ct < cols / {MR}; ct++)
      for (int i = 0; i < {MR}; i++)
        for (int j = 0; j < {NC}; j++) {{
          int o = c0 + ct * {MR} + i, r = r0 + rt * {NC} + j;
          if (o >= c1 || r >= r1) continue;
          plait_vf v = part[((long)rt * (cols / {MR}) + ct) * {MR * NC} + i * {NC} + j];
          float sum = 0.0f;
          for (int l = 0; l < {VW}; l++) sum += v[l];
          out[(long)o * nrow + r] = sum;
        }}
}}

/* dw = the sum of `parts` partial weight gradients of n values each, laid one after another in red. */
static void plait_wgrad_sum_parts(const float* red, int parts, long n, float* dw) {{
#pragma omp for schedule(static) nowait
  for (long e = 0; e < n; e++) {{
    float sum = 0.0f;
    for (int s = 0; s < parts; s++) sum += red[(long)s * n + e];
    dw[e] = sum;
  }}
}}

/* Patch rows [r0, r0 + rows) over the block's position runs (run e: kc positions from sp[e], image si[e], output
   row soy[e], columns from sox[e], sl[e] long) into b, row i at b + i * kcp; rows past nrow and positions past kc
   are zero. Each run of a row is a strided run of one input row. */
static void plait_wgrad_pack_x(const float* x, const plait_win* g, int c, int nrow, int r0, int rows, int kc, int kcp,
                               int ns, const int* sp, const int* sl, const int* si, const int* soy, const int* sox,
                               float* b) {{
  int kk = g->kh * g->kw, s = g->sw;
  long hw = (long)g->h * g->w;
  for (int i = 0; i < rows; i++) {{
    float* d = b + (long)i * kcp;
    int r = r0 + i;
    if (r >= nrow) {{
      memset(d, 0, sizeof(float) * (size_t)kcp);
      continue;
    }}
    int ci = r / kk, ky = r % kk / g->kw, kx = r % g->kw;
    int oyy = ky * g->dh - g->ph, oxx = kx * g->dw - g->pw;
    for (int e = 0; e < ns; e++) {{
      float* dd = d + sp[e];
      int run = sl[e], iy = soy[e] * g->sh + oyy;
      if (iy < 0 || iy >= g->h) {{
        memset(dd, 0, sizeof(float) * (size_t)run);
        continue;
      }}
      const float* xr = x + ((long)si[e] * c + ci) * hw + (long)iy * g->w;
      int ix0 = sox[e] * s + oxx, lo, hi;
      if (s == 1) {{
        lo = ix0 >= 0 ? 0 : -ix0;
        hi = g->w - ix0;
      }} else {{
        lo = ix0 >= 0 ? 0 : (-ix0 + s - 1) / s;
        hi = ix0 >= g->w ? 0 : (g->w - 1 - ix0) / s + 1;
      }}
      if (lo > run) lo = run;
      if (hi > run) hi = run;
      if (hi < lo) hi = lo;
      for (int q = 0; q < lo; q++) dd[q] = 0.0f;
      if (s == 1 && hi - lo > 32) {{
        memcpy(dd + lo, xr + ix0 + lo, sizeof(float) * (size_t)(hi - lo));
      }} else if (s == 1) {{ /* a short run (a 7x7 or 14x14 plane's rows): a call costs more than the copy */
        const float* xs = xr + ix0;
#pragma omp simd
        for (int q = lo; q < hi; q++) dd[q] = xs[q];
      }} else if (s == 2) {{
        const float* xs = xr + ix0;
#pragma omp simd
        for (int q = lo; q < hi; q++) dd[q] = xs[2 * q];
      }} else {{
        for (int q = lo; q < hi; q++) dd[q] = xr[ix0 + q * s];
      }}
      for (int q = hi; q < run; q++) dd[q] = 0.0f;
    }}
    for (int q = kc; q < kcp; q++) d[q] = 0.0f;
  }}
}}

/* dw (co x nrow, the weight's layout) = dy (images x co x npos) . patch rows of x (images x c x h x w) over every
   image and position. Tasks: chunks of {ROWS} patch rows x {COLS} output channels, times `parts` slices of the
   positions when there are fewer chunks than 4 per thread (their sums then meet in a shared buffer). With whole
   vectors per plane and tiles per channel chunk (inplace), blocks stay within one image, of equal multiples of {VW}
   positions up to {KCW}, and the micro-kernel reads dy's rows where they are; else blocks of {KCW} run across
   images and dy's rows are copied into a buffer padded with zeros. */
static void plait_wgrad(const float* dy, const float* x, float* dw, const plait_win* g, int images, int c, int co,
                        int nrow, int npos) {{
  long total = (long)images * npos;
  int inplace = npos % {VW} == 0 && co % {MR} == 0;
  int per = (npos + {KCW - 1}) / {KCW}, bs = (npos + per - 1) / per;
  bs = (bs + {VW - 1}) / {VW} * {VW};
  per = (npos + bs - 1) / bs;
  int nkb = inplace ? images * per : (int)((total + {KCW - 1}) / {KCW});
{_task_split()}  float* red = 0;
  if (parts > 1) {{
    red = plait_team_shared((size_t)parts * co * nrow);
    if (!red) {{
#pragma omp single copyprivate(red)
      red = plait_shared_scratch((size_t)parts * co * nrow);
    }}
  }}
{_task_head()}    float* a = plait_scratch((size_t)(cols + rows) * {KCW} + (size_t)rows * cols * {VW});
    float* b = a + (size_t)cols * {KCW};
    plait_vf* part = (plait_vf*)(b + (size_t)rows * {KCW});
    int sp[{KCW}], sl[{KCW}], si[{KCW}], soy[{KCW}], sox[{KCW}];
    for (int kb = kb0; kb < kb1; kb++) {{
      long g0 = (long)kb * {KCW};
      int kc = total - g0 < {KCW} ? (int)(total - g0) : {KCW};
      const float* ta = a; /* the block's dy rows c0.., copied into a or in place */
      if (inplace) {{
        int img = kb / per, pos0 = kb % per * bs;
        kc = npos - pos0 < bs ? npos - pos0 : bs;
        g0 = (long)img * npos + pos0;
        ta = dy + ((long)img * co + c0) * npos + pos0;
      }}
      int kcp = (kc + {VW - 1}) / {VW} * {VW}, ns = 0;
      long lda = inplace ? npos : kcp;
      for (int p = 0; p < kc;) {{ /* the block's positions as runs within one output row */
        long gg = g0 + p;
        int img = (int)(gg / npos), pos = (int)(gg % npos), ox = pos % g->ow;
        int run = g->ow - ox < kc - p ? g->ow - ox : kc - p;
        sp[ns] = p, sl[ns] = run, si[ns] = img, soy[ns] = pos / g->ow, sox[ns] = ox;
        ns++;
        p += run;
      }}
      for (int i = 0; i < (inplace ? 0 : cols); i++) {{ /* dy rows c0 + i, contiguous within each image */
        float* d = a + (long)i * kcp;
        if (c0 + i >= c1) {{
          memset(d, 0, sizeof(float) * (size_t)kcp);
          continue;
        }}
        for (int p = 0; p < kc;) {{
          long gg = g0 + p;
          int img = (int)(gg / npos), pos = (int)(gg % npos), run = npos - pos < kc - p ? npos - pos : kc - p;
          memcpy(d + p, dy + ((long)img * co + c0 + i) * npos + pos, sizeof(float) * (size_t)run);
          p += run;
        }}
        for (int q = kc; q < kcp; q++) d[q] = 0.0f;
      }}
      plait_wgrad_pack_x(x, g, c, nrow, r0, rows, kc, kcp, ns, sp, sl, si, soy, sox, b);
      for (int rt = 0; rt < rows / {NC}; rt++)
        for (int ct = 0; ct < cols / {MR}; ct++)
          plait_wgrad_micro(kcp, ta + ct * {MR} * lda, lda, b + (long)rt * {NC} * kcp,
                            part + ((long)rt * (cols / {MR}) + ct) * {MR * NC}, kb == kb0);
    }}
    plait_wgrad_store(part, rows, cols, r0, r1, c0, c1, nrow, parts > 1 ? red + (long)s * co * nrow : dw);
  }}
  if (parts > 1) plait_wgrad_sum_parts(red, parts, (long)co * nrow, dw);
}}
//@shared-end
"""


def _shift_source() -> str:
    """The library's C source of the stride-1 form: both operands padded once, then read in place."""
    return f"""//@shared-begin plait_wgrad_s1
/* acc[i][j] += dy row i (at a + i * lda) . b[j] over kcp positions (a multiple of {VW}) of each of nimg images (a and
   b[j] advance by sa and sb per image); b[j] need not be aligned. The partial sums live in part between blocks. */
static inline __attribute__((always_inline)) void plait_wgrad_s1_micro(int nimg, int kcp, const float* restrict a,
                                                                      long lda, long sa, const float* const* b, long sb,
                                                                      plait_vf* part, int first) {{
  plait_vf acc[{MR}][{NC}];
#pragma GCC unroll {MR}
  for (int i = 0; i < {MR}; i++)
#pragma GCC unroll {NC}
    for (int j = 0; j < {NC}; j++) acc[i][j] = first ? (plait_vf){{0}} : part[i * {NC} + j];
  for (int m = 0; m < nimg; m++) {{
    const float* am = a + m * sa;
    const float* bm[{NC}];
#pragma GCC unroll {NC}
    for (int j = 0; j < {NC}; j++) bm[j] = b[j] + m * sb;
    for (int p = 0; p < kcp; p += {VW}) {{
      plait_vf av[{MR}];
#pragma GCC unroll {MR}
      for (int i = 0; i < {MR}; i++) av[i] = *(const plait_vf*)(am + i * lda + p);
#pragma GCC unroll {NC}
      for (int j = 0; j < {NC}; j++) {{
        plait_vf bv = *(const plait_vf*)(bm[j] + p);
{_keep(8)}#pragma GCC unroll {MR}
        for (int i = 0; i < {MR}; i++) acc[i][j] += av[i] * bv;
      }}
    }}
  }}
#pragma GCC unroll {MR}
  for (int i = 0; i < {MR}; i++)
#pragma GCC unroll {NC}
    for (int j = 0; j < {NC}; j++) part[i * {NC} + j] = acc[i][j];
}}

/* The weight gradient of a stride-1 window. x is copied once into planes padded by the window (row pitch wp = ow +
   (kw - 1) * dw, plane pitch lp) and dy into rows of the same pitch (position t = oy * wp + ox, zero for ox >= ow
   and past oh * wp, channels padded to a multiple of {MR}), so patch row (ci, ky, kx) at position t is the padded
   plane of ci at t + ky * dh * wp + kx * dw: the micro-kernel reads both operands where they are and no patch row is
   gathered per chunk. Positions ox >= ow meet other values of the plane, multiplied by dy's zeros. Blocks are a
   part of one image's positions (large planes) or whole images, {KCW} positions or fewer (small planes). */
static void plait_wgrad_s1(const float* dy, const float* x, float* dw, const plait_win* g, int images, int c, int co,
                           int oh, int nrow) {{
  int wp = g->ow + (g->kw - 1) * g->dw, kk = g->kh * g->kw;
  long t1 = (long)oh * wp, tp = (t1 + {VW - 1}) / {VW} * {VW}, reach = (long)(g->kh - 1) * g->dh * wp + (g->kw - 1) * g->dw;
  long lp = (tp + reach + {VW - 1}) / {VW} * {VW}, xplane = (long)g->h * g->w, yplane = (long)oh * g->ow;
  int cop = (co + {MR - 1}) / {MR} * {MR};
  int ipb = tp >= {KCW} ? 1 : (int)({KCW} / tp), per = (int)((tp + {KCW - 1}) / {KCW});
  long bs = ((tp + per - 1) / per + {VW - 1}) / {VW} * {VW};
  per = (int)((tp + bs - 1) / bs);
  int nkb = ipb > 1 ? (images + ipb - 1) / ipb : images * per;
{_task_split()}  size_t nx = (size_t)images * c * lp, ny = (size_t)images * cop * tp, nred = parts > 1 ? (size_t)parts * co * nrow : 0;
  float* xp = plait_team_shared(nx + ny + nred); /* a team step: the run's buffer */
  if (!xp) {{
#pragma omp single copyprivate(xp)
    xp = plait_shared_scratch(nx + ny + nred);
  }}
  float* dyp = xp + nx;
  float* red = dyp + ny;
#pragma omp for schedule(static) nowait
  for (long t = 0; t < (long)images * (c + cop); t++) {{
    if (t < (long)images * c) {{ /* plane t of x, padded */
      float* d = xp + (t % c * images + t / c) * lp;
      const float* src = x + t * xplane;
      long top = (long)g->ph * wp + g->pw; /* the zeros before the first input value */
      memset(d, 0, sizeof(float) * (size_t)top);
      for (int iy = 0; iy < g->h; iy++) {{ /* a row, then the gap to the next row's first value */
        float* row = d + top + (long)iy * wp;
        memcpy(row, src + (long)iy * g->w, sizeof(float) * (size_t)g->w);
        long gap = iy + 1 < g->h ? wp - g->w : lp - (top + (long)iy * wp + g->w);
        memset(row + g->w, 0, sizeof(float) * (size_t)gap);
      }}
      continue;
    }}
    long u = t - (long)images * c;
    int n = (int)(u / cop), o = (int)(u % cop);
    float* d = dyp + ((long)o * images + n) * tp;
    if (o >= co) {{
      memset(d, 0, sizeof(float) * (size_t)tp);
      continue;
    }}
    const float* src = dy + ((long)n * co + o) * yplane;
    for (int oy = 0; oy < oh; oy++) {{
      memcpy(d + (long)oy * wp, src + (long)oy * g->ow, sizeof(float) * (size_t)g->ow);
      memset(d + (long)oy * wp + g->ow, 0, sizeof(float) * (size_t)(wp - g->ow));
    }}
    memset(d + t1, 0, sizeof(float) * (size_t)(tp - t1));
  }}
  plait_team_barrier(); /* both operands are padded before any task reads them */
{_task_head()}    plait_vf* part = (plait_vf*)plait_scratch((size_t)rows * cols * {VW});
    for (int kb = kb0; kb < kb1; kb++) {{
      int img = ipb > 1 ? kb * ipb : kb / per, nimg = 1;
      long pos0 = ipb > 1 ? 0 : kb % per * bs, kc = tp - pos0 < bs ? tp - pos0 : bs;
      if (ipb > 1) nimg = images - img < ipb ? images - img : ipb;
      const float* ta = dyp + ((long)c0 * images + img) * tp + pos0;
      for (int rt = 0; rt < rows / {NC}; rt++) {{
        const float* b[{NC}];
        for (int j = 0; j < {NC}; j++) {{ /* rows past nrow repeat the last one; their sums are not stored */
          int r = r0 + rt * {NC} + j < nrow ? r0 + rt * {NC} + j : nrow - 1;
          int ci = r / kk, ky = r % kk / g->kw, kx = r % g->kw;
          b[j] = xp + ((long)ci * images + img) * lp + pos0 + (long)ky * g->dh * wp + kx * g->dw;
        }}
        for (int ct = 0; ct < cols / {MR}; ct++)
          plait_wgrad_s1_micro(nimg, (int)kc, ta + (long)ct * {MR} * images * tp, images * tp, tp, b, lp,
                               part + ((long)rt * (cols / {MR}) + ct) * {MR * NC}, kb == kb0);
      }}
    }}
    plait_wgrad_store(part, rows, cols, r0, r1, c0, c1, nrow, parts > 1 ? red + (long)s * co * nrow : dw);
  }}
  if (parts > 1) plait_wgrad_sum_parts(red, parts, (long)co * nrow, dw);
}}
//@shared-end
"""


# Channels-last form: output-gradient rows x input-channel vectors per register tile, 24 accumulators of AVX-512's 32
# registers or 12 of AVX2's 16 (with CV vectors of x and a broadcast of dy beside them).
CR, CV = (6, 4) if VW == 16 else (6, 2)
CL_POSITIONS = 128  # channels-last form: about this many output positions (whole output rows) per block
CL_COLS = 96  # channels-last form: output channels per task
CL_ENABLED = 1  # the channels-last form on (0: the position-major form takes its windows; an A/B switch)
# Fewest input channels for the channels-last form. At 64 (resnet18's layer1) its sums, as close to float64 as the
# position-major form's, moved tests/torch/test_training.py's 10-step resnet18 running means past their bound (a
# summation-order effect that moved to another layer with the task split); kept out until that is understood.
CL_MIN_CHANNELS = 128


def _channels_last_source() -> str:
    """The library's C source of the channels-last stride-1 form: x copied once channels-last, dy read in place."""
    cw = VW * CV
    dy_rows = "\n".join(f"  const float* d{j} = dy[{j}];" for j in range(CR))  # dy's CR rows as named pointers
    taps = ", ".join(f"d{j}[q0 + ox]" for j in range(CR))
    return f"""//@shared-begin plait_wgrad_cl
/* acc[j][v] ({VW} input channels each) += dy row j (at dy[j] + oy * ow + ox) times x's channel vectors v at padded
   position (oy, ox) of xa (row pitch wp, position pitch cip), for output rows [oy0, oy1); part keeps the sums. */
static inline __attribute__((always_inline)) void plait_wgrad_cl_micro(int oy0, int oy1, int ow, long wp, int cip,
                                                                      const float* restrict xa,
                                                                      const float* const* dy, plait_vf* part,
                                                                      int first) {{
  plait_vf acc[{CR}][{CV}];
#pragma GCC unroll {CR}
  for (int j = 0; j < {CR}; j++)
#pragma GCC unroll {CV}
    for (int v = 0; v < {CV}; v++) acc[j][v] = first ? (plait_vf){{0}} : part[j * {CV} + v];
{dy_rows}
  for (int oy = oy0; oy < oy1; oy++) {{
    const float* xr = xa + (long)oy * wp * cip;
    long q0 = (long)oy * ow;
    for (int ox = 0; ox < ow; ox++) {{
      plait_vf xv[{CV}];
#pragma GCC unroll {CV}
      for (int v = 0; v < {CV}; v++) xv[v] = *(const plait_vf*)(xr + (long)ox * cip + v * {VW});
      float dv[{CR}] = {{{taps}}};
#pragma GCC unroll {CR}
      for (int j = 0; j < {CR}; j++)
#pragma GCC unroll {CV}
        for (int v = 0; v < {CV}; v++) acc[j][v] += xv[v] * dv[j];
    }}
  }}
#pragma GCC unroll {CR}
  for (int j = 0; j < {CR}; j++)
#pragma GCC unroll {CV}
    for (int v = 0; v < {CV}; v++) part[j * {CV} + v] = acc[j][v];
}}

/* The weight gradient of a stride-1 window whose channels fill whole {cw}-channel tiles: x is copied once into a
   channels-last buffer padded by the window (position (py, px) of image n holds channels 0..c at ((n * hp + py) *
   wp + px) * c), so the tap (ky, kx) of output position (oy, ox) is the channel vector at (oy + ky * dh, ox + kx *
   dw): {CV} vectors of x by {CR} scalars of dy (read where they are) per position, every output position counted
   once (the position-major form pads each output row by the window). Tasks: {cw}-channel blocks of x times {CL_COLS}
   output channels, times `parts` slices of the position blocks (whole output rows of one image) when there are
   fewer than 4 per thread; their sums meet in a shared buffer. */
static void plait_wgrad_cl(const float* dy, const float* x, float* dw, const plait_win* g, int images, int c, int co,
                           int oh) {{
  int kk = g->kh * g->kw, nrow = c * kk, ow = g->ow;
  int hp = oh + (g->kh - 1) * g->dh, wp = ow + (g->kw - 1) * g->dw;
  long npos = (long)oh * ow, xplane = (long)g->h * g->w;
  int rpb = {CL_POSITIONS} / ow > 0 ? {CL_POSITIONS} / ow : 1;
  if (rpb > oh) rpb = oh;
  int per = (oh + rpb - 1) / rpb, nkb = images * per;
  int rch = c / {cw}, cch = (co + {CL_COLS - 1}) / {CL_COLS};
  long base = (long)rch * cch, want = 4L * omp_get_num_threads();
  int parts = base >= want ? 1 : (int)((want + base - 1) / base);
  if (parts > nkb) parts = nkb;
  size_t nx = (size_t)images * hp * wp * c, nred = parts > 1 ? (size_t)parts * co * nrow : 0;
  float* xp = plait_team_shared(nx + nred); /* a team step: the run's buffer */
  if (!xp) {{
#pragma omp single copyprivate(xp)
    xp = plait_shared_scratch(nx + nred);
  }}
  float* red = xp + nx;
#pragma omp for schedule(static) nowait
  for (long t = 0; t < (long)images * hp; t++) {{ /* padded row py of image n, channels last */
    int n = (int)(t / hp), py = (int)(t % hp), iy = py - g->ph;
    float* d = xp + t * wp * c;
    memset(d, 0, sizeof(float) * (size_t)wp * c);
    if (iy < 0 || iy >= g->h) continue;
    int lo = g->pw, hi = g->pw + g->w < wp ? g->pw + g->w : wp;
    for (int ci = 0; ci < c; ci++) {{
      const float* s = x + ((long)n * c + ci) * xplane + (long)iy * g->w - g->pw;
      for (int px = lo; px < hi; px++) d[(long)px * c + ci] = s[px];
    }}
  }}
  plait_team_barrier(); /* x is copied before any task reads it */
#pragma omp for schedule(dynamic, 1)
  for (long t = 0; t < base * parts; t++) {{
    int s = (int)(t % parts), rc = (int)(t / parts / cch), cc = (int)(t / parts % cch);
    int ci0 = rc * {cw}, c0 = cc * {CL_COLS}, c1 = c0 + {CL_COLS} < co ? c0 + {CL_COLS} : co;
    int tiles = (c1 - c0 + {CR - 1}) / {CR};
    int kb0 = (int)((long)s * nkb / parts), kb1 = (int)((long)(s + 1) * nkb / parts);
    plait_vf* part = (plait_vf*)plait_scratch((size_t)kk * tiles * {CR * CV} * {VW});
    for (int kb = kb0; kb < kb1; kb++) {{
      int n = kb / per, oy0 = kb % per * rpb, oy1 = oy0 + rpb < oh ? oy0 + rpb : oh;
      for (int ct = 0; ct < tiles; ct++) {{
        const float* dr[{CR}];
        for (int j = 0; j < {CR}; j++) {{ /* rows past co repeat the last one; their sums are not stored */
          int o = c0 + ct * {CR} + j < c1 ? c0 + ct * {CR} + j : c1 - 1;
          dr[j] = dy + ((long)n * co + o) * npos;
        }}
        for (int tap = 0; tap < kk; tap++) {{
          int ky = tap / g->kw, kx = tap % g->kw;
          const float* xa = xp + (((long)n * hp + (long)ky * g->dh) * wp + (long)kx * g->dw) * c + ci0;
          plait_wgrad_cl_micro(oy0, oy1, ow, wp, c, xa, dr, part + ((long)tap * tiles + ct) * {CR * CV}, kb == kb0);
        }}
      }}
    }}
    float* out = parts > 1 ? red + (long)s * co * nrow : dw;
    for (int ct = 0; ct < tiles; ct++)
      for (int j = 0; j < {CR}; j++) {{
        int o = c0 + ct * {CR} + j;
        if (o >= c1) continue;
        for (int tap = 0; tap < kk; tap++) {{
          const float* pv = (const float*)(part + ((long)tap * tiles + ct) * {CR * CV} + j * {CV});
          for (int l = 0; l < {cw}; l++) out[(long)o * nrow + (long)(ci0 + l) * kk + tap] = pv[l];
        }}
      }}
  }}
  if (parts > 1) plait_wgrad_sum_parts(red, parts, (long)co * nrow, dw);
}}
//@shared-end
"""


def library() -> str:
    """The shared C code of the weight-gradient product (after the GEMM library's common declarations)."""
    return (
        gemm_c.at_o2(gemm_c.COMMON)
        + gemm_c.at_o2(_source())
        + gemm_c.at_o2(_shift_source())
        + gemm_c.at_o2(_channels_last_source())
    )


def shifted(win: Any) -> bool:
    """Whether `win` takes the stride-1 form (plait_wgrad_s1: operands padded once, read in place at shifted
    offsets) rather than the patch-row gather of plait_wgrad."""
    return bool(win.sh == win.sw == 1)


def channels_last(win: Any) -> bool:
    """Whether `win` takes the channels-last stride-1 form (plait_wgrad_cl): a stride-1 window of more than one tap
    over input channels that fill whole tiles of CV vectors, CL_MIN_CHANNELS or more (the 3x3 layers of resnets and
    VGGs from 128 channels)."""
    return bool(
        CL_ENABLED and shifted(win) and win.kh * win.kw > 1 and win.c % (VW * CV) == 0 and win.c >= CL_MIN_CHANNELS
    )


def call(win: Any, co: int) -> str:
    """The statements of a kernel body computing b0 = the weight gradient from b1 = dy and b2 = x over `win`."""
    rows, npos = win.c * win.kh * win.kw, win.oh * win.ow
    if channels_last(win):
        run = f"plait_wgrad_cl(b1, b2, b0, &win, {win.n}, {win.c}, {co}, {win.oh});"
    elif shifted(win):
        run = f"plait_wgrad_s1(b1, b2, b0, &win, {win.n}, {win.c}, {co}, {win.oh}, {rows});"
    else:
        run = f"plait_wgrad(b1, b2, b0, &win, {win.n}, {win.c}, {co}, {rows}, {npos});"
    return f"{gemm_c.win_decl(win)}  {run}\n"
