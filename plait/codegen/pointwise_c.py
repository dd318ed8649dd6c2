"""The C kernel for products with few rows over long, row-contiguous B: pointwise (1x1) convolutions with few output
channels (mobilenet_v2's 16-64-channel projections, whose B is the image itself, channels x pixels).

The GEMM library packs B into panels before multiplying; with 16-32 rows each packed element feeds only that many
multiply-adds, so the packing copy (K strided rows per panel, one memory stream each) cost twice the multiply-adds
(`perf`: 50% of mobilenet_v2's 24x3136x144 product in memmove). Here B is read where it lies: a block of VW*NV
columns of all K rows meets every row block of the (packed, transposed) weights while it is in L1, and the next
block's lines are prefetched while the first row block runs, so B streams from memory once with no copy. The fused
epilogue runs on each finished block while it is in cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plait.codegen.gemm_c import PRICED_THREADS, VW, pack_panels, static_busiest

MAX_ROWS = 32  # products with at most this many rows take this kernel (measured: docs/benchmarks.md)
MIN_COLS = 512  # ... and at least this many columns per product (narrower ones merge images in the GEMM)
L1_BLOCK = 32768  # bytes of one column block of B (K rows x VW*NV columns) kept in L1 across the row blocks
# register tiles (rows, vectors per row), widest first, and their cost per padded multiply-add relative to the best.
# 16-float vectors (32 registers): MR * NV accumulators of 24-28 registers, a one-vector tile loading B as often as
# it multiplies. 8- and 4-float vectors (16 registers): 12 accumulators, since 14 (7x2) or 3-4 vector operands (4x3,
# 3x4) spill; a standalone C test of the tile's k loop (k 256 in L1, one thread, the Zen 3 guest, docs/benchmarks.md)
# ran 6x2 at 96-98 GFLOP/s, 12x1 at 82-83.
TILE_COST = {(6, 4): 1.0, (8, 3): 1.0, (12, 2): 1.1, (16, 1): 1.3} if VW == 16 else {(6, 2): 1.0, (12, 1): 1.18}
TILES = tuple(TILE_COST)
# columns per run of blocks whose rows are prefetched together: rows read in runs of 1.5 KB or more stream at the
# sequential rate, in 192-byte pieces (one block) at a third of it (a read test of 144 rows x 3136 columns)
SUPER_COLS = 384

PREFETCH = """//@shared-begin plait_pw_prefetch
/* Prefetch rows [p0, p1) of B (sbk apart), columns [j, j + w) (clipped to n), each row's run as one sequence. */
static void plait_pw_prefetch(const float* b, long sbk, int p0, int p1, int j, int w, int n) {
  if (j + w > n) w = n - j;
  for (int p = p0; p < p1; p++) {
    const char* r = (const char*)(b + (long)p * sbk + j);
    for (int o = 0; o < w * 4; o += 64) __builtin_prefetch(r + o, 0, 3);
  }
}
//@shared-end
"""


def fits(spec: Any) -> bool:
    """Whether `spec` runs as the streaming pointwise product: no convolution window (a 1x1 convolution is a plain
    product over the image), B contiguous along its columns, few rows, many columns, not a swapped (narrow) product."""
    _, _, sbk, sbn = spec.b
    # (a weight gradient's transposed patch columns, `conv_t`, are gathered from the image: not a strided B)
    plain = spec.conv is None and getattr(spec, "conv_t", None) is None
    return plain and sbn == 1 and sbk >= spec.n and spec.m <= MAX_ROWS and spec.n >= MIN_COLS


def pick_tile(m: int, k: int) -> tuple[int, int]:
    """The register tile (rows, vectors) for m rows over k: among the tiles whose column block of B (k rows) stays in
    L1, the one with the least padded work, its rows split into equal blocks (a one-vector tile loads B as often as
    it multiplies, so it counts a little more: TILE_COST)."""
    fit = [t for t in TILES if k * t[1] * VW * 4 <= L1_BLOCK] or [TILES[-1]]

    def split(t: tuple[int, int]) -> tuple[int, int]:
        blocks = -(-m // t[0])
        return -(-m // blocks), t[1]

    def cost(t: tuple[int, int]) -> float:
        mr, _ = split(t)
        return -(-m // mr) * mr * TILE_COST[t]

    return split(min(fit, key=cost))


def _tile(mr: int, nv: int) -> str:
    """C[mr x VW*nv] of one column block: wt holds the row block's weights transposed (k x mr), x the block's K rows
    ldx apart; the sums stay in registers, `rows` of them stored (ldc apart), `cols` columns."""
    nr = nv * VW
    t = f"{mr}x{nv}"
    return f"""static void plait_pw_tile_{t}(int k, const float* restrict wt, const float* restrict x, long ldx,
                                float* restrict c, long ldc, int rows, int cols) {{
  plait_vf acc[{mr}][{nv}];
#pragma GCC unroll {mr}
  for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) acc[i][v] = (plait_vf){{0}};
  for (int p = 0; p < k; p++) {{
    const float* xp = x + (long)p * ldx;
    plait_vf b[{nv}];
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) b[v] = *(const plait_vf*)(xp + v * {VW});
    const float* w = wt + p * {mr};
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) acc[i][v] += b[v] * w[i];
  }}
  if (cols == {nr}) {{
    for (int i = 0; i < rows; i++)
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) *(plait_vf*)(c + i * ldc + v * {VW}) = acc[i][v];
  }} else {{
    float tmp[{nr}] __attribute__((aligned(64)));
    for (int i = 0; i < rows; i++) {{
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) *(plait_vf*)(tmp + v * {VW}) = acc[i][v];
      memcpy(c + i * ldc, tmp, sizeof(float) * (size_t)cols);
    }}
  }}
}}
"""


def _driver(mr: int, nv: int) -> str:
    """The product over every batch entry: tasks of (entry, range of column blocks) under one static parallel loop;
    the weights are packed once per call (shared by every entry) or per task (when the entries' A differ)."""
    nr = nv * VW
    t = f"{mr}x{nv}"
    sup = max(1, SUPER_COLS // nr)
    return f"""/* Pack rows of A (m x k, strides sam, sak) as row blocks of {mr}, each transposed (k x {mr}, zero rows past m). */
static void plait_pw_pack_{t}(int m, int k, const float* a, long sam, long sak, float* wt) {{
  int blocks = (m + {mr - 1}) / {mr};
  for (int r = 0; r < blocks; r++)
    for (int p = 0; p < k; p++)
      for (int i = 0; i < {mr}; i++) {{
        int row = r * {mr} + i;
        wt[((long)r * k + p) * {mr} + i] = row < m ? a[row * sam + p * sak] : 0.0f;
      }}
}}

/* C[bz] = A[bz] @ B[bz] (B's rows sbk apart, contiguous along n), bz = outer * inner + inner index. */
static void plait_pointwise_{t}(long batch, long inner, int m, int n, int k, const float* A, long sab, long sai,
                                long sam, long sak, const float* B, long sbb, long sbi, long sbk, float* C,
                                plait_epi_fn epi, void* const* extra) {{
  int blocks = (m + {mr - 1}) / {mr}, shared_a = (sab == 0 || batch == 1) && (sai == 0 || inner == 1);
  long wsize = (long)blocks * k * {mr}, cblocks = (n + {nr - 1}) / {nr};
  long want = 4L * omp_get_num_threads(), per = batch >= want ? 1 : (want + batch - 1) / batch;
  if (per > cblocks) per = cblocks;
  float* wshared = 0;
  if (shared_a) {{ /* one thread packs for the team (orphaned worksharing: see plait/codegen/c.py) */
    wshared = plait_team_shared((size_t)wsize); /* a team step: the run's buffer */
    if (wshared) {{
#pragma omp single nowait
      plait_pw_pack_{t}(m, k, A, sam, sak, wshared);
      plait_team_barrier();
    }} else {{ /* run alone: one thread's buffer, its address given to the whole team */
#pragma omp single copyprivate(wshared)
      {{
        wshared = plait_shared_scratch((size_t)wsize);
        plait_pw_pack_{t}(m, k, A, sam, sak, wshared);
      }}
    }}
  }}
#pragma omp for schedule(static) nowait
  for (long task = 0; task < batch * per; task++) {{
    long bz = task / per;
    long q0 = cblocks * (task % per) / per, q1 = cblocks * (task % per + 1) / per;
    const float* b = B + bz / inner * sbb + bz % inner * sbi;
    float* c = C + bz * (long)m * n;
    float* scratch = plait_scratch((size_t)((shared_a ? 0 : wsize) + (long)k * {nr}));
    float* tail = scratch + (shared_a ? 0 : wsize);
    const float* wt = wshared;
    if (!shared_a) {{
      plait_pw_pack_{t}(m, k, A + bz / inner * sab + bz % inner * sai, sam, sak, scratch);
      wt = scratch;
    }}
    for (long q = q0; q < q1; q++) {{
      int j = (int)(q * {nr}), cols = n - j < {nr} ? n - j : {nr};
      const float* x = b + j;
      long ldx = sbk;
      /* at the start of each run of SUPER blocks, the next run's rows are prefetched a share at a time, each row's
         run in one go, so the hardware sees long sequential runs instead of K interleaved short ones */
      long s0 = q - (q - q0) % {sup}, next = s0 + {sup};
      if (q == q0) plait_pw_prefetch(b, sbk, 0, k, j, (int)((q1 < next ? q1 : next) - q) * {nr}, n);
      if (next < q1) {{
        int share = (k + {sup - 1}) / {sup}, p0 = (int)(q - s0) * share, p1 = p0 + share < k ? p0 + share : k;
        plait_pw_prefetch(b, sbk, p0, p1, (int)(next * {nr}), (int)((q1 < next + {sup} ? q1 : next + {sup}) - next) * {nr}, n);
      }}
      if (cols < {nr}) {{ /* the last partial block: its columns copied into zero-padded rows */
        for (int p = 0; p < k; p++) {{
          memcpy(tail + (long)p * {nr}, b + (long)p * sbk + j, sizeof(float) * (size_t)cols);
          memset(tail + (long)p * {nr} + cols, 0, sizeof(float) * (size_t)({nr} - cols));
        }}
        x = tail;
        ldx = {nr};
      }}
      for (int r = 0; r < blocks; r++) {{
        int rows = m - r * {mr} < {mr} ? m - r * {mr} : {mr};
        plait_pw_tile_{t}(k, wt + (long)r * k * {mr}, x, ldx, c + (long)r * {mr} * n + j, n, rows, cols);
      }}
      if (epi) epi(c, bz, 0, j, m, cols, extra);
    }}
  }}
}}
"""


def library(mr: int, nv: int) -> str:
    """The shared C code of the pointwise product with one register tile (after gemm_c.COMMON's declarations)."""
    from plait.codegen import gemm_c

    body = f"//@shared-begin plait_pointwise_{mr}x{nv}\n{_tile(mr, nv)}{_driver(mr, nv)}//@shared-end\n"
    return gemm_c.at_o2(gemm_c.COMMON) + gemm_c.at_o2(PREFETCH) + gemm_c.at_o2(body)


def call(spec: Any, mr: int, nv: int, a_args: str, b_args: str, epi_fn: str, extra: str) -> str:
    """The statements of a kernel body that run `spec` as the pointwise product (a_args: A, sab, sai, sam, sak;
    b_args: B, sbb, sbi, sbk)."""
    return (
        f"  plait_pointwise_{mr}x{nv}({spec.batch}, {spec.inner}, {spec.m}, {spec.n}, {spec.k}, {a_args}, {b_args},"
        f" C, {epi_fn}, {extra});\n"
    )


# --- 1x1 convolutions over narrow planes, output channels across the vector lanes, weights packed at plan build ---
#
# On 7x7 and 14x14 planes (mobilenet_v2's late blocks) the GEMM puts the 49 or 196 pixels across the lanes, packs
# the image into panels on every call and meets each row block of weights with one to four panels. ONNX Runtime keeps
# its weights packed and the channels in its vectors; so does this kernel: the weights are packed once, when the plan
# is built, as panels of VW*NV output channels (k x VW*NV each, a constant the plan keeps), every pixel of the image is
# broadcast from where it lies (no packing per call), and a tile's sums go back into the NCHW planes through a small
# transposing copy. (Packing the weights for the GEMM's own orientation instead made it slower: docs/benchmarks.md.)

# One image's product over 32 to 511 pixels (7x7 to 14x14 planes) with at least one vector of output channels over at
# most LANES_MAX_K input channels: mobilenet_v2's such layers ran 10-30% faster in whole plans (resnet50's neutral);
# its 7x7 products over 960 input channels 15-25% slower. At batch 16 (where the GEMM merges the images' columns into
# one wide product) the GEMM was faster (benchmarks/bench_pwlanes_ab.py, docs/benchmarks.md).
LANES_COLS = (32, 512)
# With 8- or 4-float vectors (16 registers) the GEMM ran these products faster than the lanes kernel, which then
# holds only 12 accumulators and transposes every 6 x 16 tile back into the planes: on the Zen 3 guest (two threads,
# bench_far_ab.py, docs/benchmarks.md) resnet50 b1's three 2048x49x512 products 3.35 -> 2.77 ms and six 1024x196x256
# 5.70 -> 5.53 ms, mobilenet_v2 b1's 1280x49x320 0.52 -> 0.46 ms. So the lanes kernel runs only with 16-float vectors.
LANES = VW == 16
LANES_MIN_ROWS = 16
LANES_MAX_K = 576
# A lanes product runs its whole k (at most LANES_MAX_K) in one pass: its tile's sums are transposed into C once and
# the panel streams from L2. Blocks of 256 input channels (the tile's sums added into C again per block) measured
# slower on the Zen 5 guest, against a control of 257 in a library of its own: one thread, fewest thread CPU of 20,
# resnet50's 2048x49x512 0.681/0.683/0.649 -> 0.652/0.654/0.633 ms, mobilenet_v2's 1280x49x320 0.221 -> 0.208; two
# threads (bench_far_ab.py, 20 windows) resnet50 b1 replays 19.17 -> 19.11 ms (faster in 14 of 19), mobilenet_v2 b1
# per-window ratio 0.982 (docs/benchmarks.md)
# The lanes driver is inlined into each kernel, so that gcc specialises it for the layer's constant sizes (shared by
# the kernels of one library, as in a whole plan's batch build, it was compiled once for all of them). resnet50 b1,
# one thread, fewest thread CPU of 20, both build orders: the three 2048x49x512 0.62-0.63 -> 0.54-0.57 ms, all PWLANES
# kernels 5.00 -> 4.62 ms; two threads, the three 0.991 -> 0.871 ms (docs/benchmarks.md)
LANES_INLINE = True
# (pixels, channel vectors) of the register tile, and its measured cost per padded multiply-add relative to the best
# (a standalone C test of mobilenet_v2's 7x7 and 14x14 products, one thread, docs/benchmarks.md). With 16 registers
# (8- or 4-float vectors) the tiles hold 8-12 accumulators: the tile's k loop alone (k 256 in L1, one thread, the
# Zen 3 guest) ran 6x2 at 96-98 GFLOP/s, 5x2 89-94, 8x1 83-85, 12x1 82-83, 7x2 81-86 (14 accumulators, 2 weight
# vectors and the broadcast: one more than the 16 registers), 4x3 66-71.
LANES_TILES = (
    {(7, 3): 1.0, (8, 3): 1.0, (7, 4): 1.02, (6, 4): 1.05, (12, 2): 1.1}
    if VW == 16
    else {(6, 2): 1.0, (5, 2): 1.07, (7, 2): 1.15, (8, 1): 1.16, (12, 1): 1.18}
)
# the team's threads a tile's work is priced to split evenly over: resnet50 b1's 2048x49 products took 7x3 (43
# panels of 48 channels, 21:22 between two threads; 7x4: 32 panels, 16:16)
LANES_SPLIT = PRICED_THREADS


@dataclass(frozen=True)
class LanesPlan:
    """One 1x1 product run across the lanes: m output channels, k input channels, register tile `mr` pixels x `nv`
    vectors of channels, and the weight view (offset, row stride, column stride) the packing reads."""

    m: int
    k: int
    mr: int
    nv: int
    w_view: tuple[int, int, int]

    @property
    def packed_size(self) -> int:
        """Floats of the packed weights: every panel of VW*nv channels (zero past m) over all k."""
        nr = self.nv * VW
        return -(-self.m // nr) * nr * self.k

    def render_pack(self) -> tuple[str, str]:
        """(name stem, C body) of the weight packing (gemm_c.pack_panels, panels of VW*nv channels); it runs once,
        when the plan is built."""
        nr = self.nv * VW
        return f"PWPACK_{self.m}x{self.k}x{nr}", pack_panels(self.m, self.k, nr, self.w_view)


def lanes_fits(spec: Any) -> bool:
    """Whether `spec` runs across the lanes (with 16-float vectors, LANES): one plain product (a 1x1 convolution over one image) whose B rows are
    contiguous pixels, LANES_COLS pixels, at least LANES_MIN_ROWS output channels, at most LANES_MAX_K input
    channels."""
    _, _, sbk, sbn = spec.b
    plain = spec.conv is None and getattr(spec, "conv_t", None) is None and spec.batch == 1
    cols = LANES_COLS[0] <= spec.n < LANES_COLS[1]
    rows = LANES_MIN_ROWS <= spec.m and spec.k <= LANES_MAX_K
    return LANES and plain and sbn == 1 and sbk >= spec.n and cols and rows


def _lanes_split_loss(panels: int, tiles: int) -> float:
    """The busiest of LANES_SPLIT threads' share of (panel, pixel tile) pairs against an even share, under
    plait_pwlanes' split of one image (tasks of runs of panels, then of pixel tiles, dealt out statically)."""
    want = 4 * LANES_SPLIT
    chunks = min(want, panels)
    per = min(-(-want // chunks), tiles)
    work = [
        (panels * (c + 1) // chunks - panels * c // chunks) * (tiles * (q + 1) // per - tiles * q // per)
        for c in range(chunks)
        for q in range(per)
    ]
    return static_busiest(work, LANES_SPLIT) * LANES_SPLIT / (panels * tiles)


def lanes_plan(spec: Any) -> LanesPlan:
    """The tile with the least padded work (channels to whole panels, pixels to whole tiles) times its cost."""

    def cost(t: tuple[int, int]) -> float:
        mr, nv = t
        panels, tiles = -(-spec.m // (nv * VW)), -(-spec.n // mr)
        return panels * nv * VW * tiles * mr * LANES_TILES[t] * _lanes_split_loss(panels, tiles)

    mr, nv = min(LANES_TILES, key=cost)
    ao, _, sam, sak = spec.a
    return LanesPlan(spec.m, spec.k, mr, nv, (ao, sam, sak))


def _lanes_tile(mr: int, nv: int) -> str:
    """C[VW*nv channels x mr pixels] of one tile: wp is the panel (k x VW*nv), x the tile's
    first pixel of input channel 0 (channels ldx apart); the sums go back through a transposing copy, `rows`
    channels x `px` pixels."""
    nr = nv * VW
    t = f"{mr}x{nv}"
    return f"""static void plait_pwl_tile_{t}(int k, const float* restrict wp, const float* restrict x, long ldx,
                                 float* restrict c, long ldc, int rows, int px) {{
  plait_vf acc[{mr}][{nv}];
#pragma GCC unroll {mr}
  for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) acc[i][v] = (plait_vf){{0}};
  for (int p = 0; p < k; p++) {{
    plait_vf w[{nv}];
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) w[v] = *(const plait_vf*)(wp + p * {nr} + v * {VW});
    const float* xp = x + p * ldx;
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++) {{
      float s = xp[i];
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) acc[i][v] += w[v] * s;
    }}
  }}
  float tmp[{mr}][{nr}] __attribute__((aligned(64)));
#pragma GCC unroll {mr}
  for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) *(plait_vf*)(tmp[i] + v * {VW}) = acc[i][v];
  if (px == {mr}) {{
    for (int ch = 0; ch < rows; ch++)
#pragma GCC unroll {mr}
      for (int i = 0; i < {mr}; i++) c[ch * ldc + i] = tmp[i][ch];
  }} else {{
    for (int ch = 0; ch < rows; ch++)
      for (int i = 0; i < px; i++) c[ch * ldc + i] = tmp[i][ch];
  }}
}}
"""


def _lanes_driver(mr: int, nv: int) -> str:
    """Tasks of (batch entry, run of panels, run of pixel tiles) under one static parallel loop: a panel stays in L1
    while its pixel tiles run, and the task's next panel is prefetched into L2 meanwhile, a share per tile (the
    weights come from L3 in every replay, and a panel read on demand in short runs arrives at latency-bound rates);
    the epilogue runs on each finished panel's block."""
    nr = nv * VW
    t = f"{mr}x{nv}"
    return f"""/* C[bz] (m x n) = A @ B[bz] with A packed as panels of {nr} channels (plait_pwl_tile_{t}); B's rows (input
   channels) are sbk apart, contiguous along the n pixels. */
static {"inline __attribute__((always_inline)) " if LANES_INLINE else ""}void plait_pwlanes_{t}(long batch, long inner, int m, int n, int k, const float* wp, const float* B, long sbb,
                              long sbi, long sbk, float* C, plait_epi_fn epi, void* const* extra) {{
  int panels = (m + {nr - 1}) / {nr}, tiles = (n + {mr - 1}) / {mr};
  long want = 4L * omp_get_num_threads(), lines = (long)k * {nr} / 16;
  long chunks = batch >= want ? 1 : (want + batch - 1) / batch;
  if (chunks > panels) chunks = panels;
  long per = batch * chunks >= want ? 1 : (want + batch * chunks - 1) / (batch * chunks);
  if (per > tiles) per = tiles;
#pragma omp for schedule(static) nowait
  for (long task = 0; task < batch * chunks * per; task++) {{
    long bz = task / (chunks * per), ck = task / per % chunks;
    int pa = (int)(panels * ck / chunks), pb = (int)(panels * (ck + 1) / chunks);
    int t0 = (int)(tiles * (task % per) / per), t1 = (int)(tiles * (task % per + 1) / per);
    int j0 = t0 * {mr}, j1 = t1 * {mr} < n ? t1 * {mr} : n;
    const float* b = B + bz / inner * sbb + bz % inner * sbi;
    float* c = C + bz * (long)m * n;
    plait_pwl_prefetch(wp + (long)pa * k * {nr}, 0, lines);
    /* a partial last tile (whose whole-tile reads could pass the image): its pixels, zero-padded, copied once for
       all the task's panels */
    int jp = j1 - j0 > (j1 - j0) / {mr} * {mr} ? j0 + (j1 - j0) / {mr} * {mr} : j1;
    float* xt = 0;
    if (jp < j1) {{
      xt = plait_scratch((size_t)k * {mr});
      for (int p = 0; p < k; p++)
        for (int i = 0; i < {mr}; i++) xt[p * {mr} + i] = jp + i < j1 ? b[(long)p * sbk + jp + i] : 0.0f;
    }}
    for (int pn = pa; pn < pb; pn++) {{
      const float* w = wp + (long)pn * k * {nr};
      int rows = m - pn * {nr} < {nr} ? m - pn * {nr} : {nr};
      long share = (lines + (t1 - t0) - 1) / (t1 - t0), l0 = 0;
      for (int j = j0; j < j1; j += {mr}, l0 += share) {{
        if (pn + 1 < pb && l0 < lines) plait_pwl_prefetch(w + (long)k * {nr}, l0, l0 + share < lines ? l0 + share : lines);
        int px = j1 - j < {mr} ? j1 - j : {mr};
        float* cj = c + (long)pn * {nr} * n + j;
        const float* xj = b + j;
        if (px == {mr}) plait_pwl_tile_{t}(k, w, xj, sbk, cj, n, rows, px);
        else plait_pwl_tile_{t}(k, w, xt, {mr}, cj, n, rows, px);
      }}
      if (epi) epi(c, bz, pn * {nr}, j0, rows, j1 - j0, extra);
    }}
  }}
}}
"""


LANES_PREFETCH = """//@shared-begin plait_pwl_prefetch
/* Prefetch lines [l0, l1) of a packed panel into L2. */
static inline void plait_pwl_prefetch(const float* w, long l0, long l1) {
  for (long l = l0; l < l1; l++) __builtin_prefetch(w + l * 16, 0, 2);
}
//@shared-end
"""


def lanes_library(mr: int, nv: int) -> str:
    """The shared C code of the across-the-lanes 1x1 product with one register tile (after gemm_c.COMMON); each
    block is shared by name, so kernels with different tiles build in one translation unit."""
    from plait.codegen import gemm_c

    body = f"//@shared-begin plait_pwlanes_{mr}x{nv}\n{_lanes_tile(mr, nv)}{_lanes_driver(mr, nv)}//@shared-end\n"
    return gemm_c.at_o2(gemm_c.COMMON) + gemm_c.at_o2(LANES_PREFETCH) + gemm_c.at_o2(body)


def lanes_call(spec: Any, p: LanesPlan, b_args: str, epi_fn: str, extra: str) -> str:
    """The statements of a kernel body that run `spec` across the lanes, A being the packed weights (b_args: B, sbb,
    sbi, sbk)."""
    return (
        f"  plait_pwlanes_{p.mr}x{p.nv}({spec.batch}, {spec.inner}, {spec.m}, {spec.n}, {spec.k}, A, {b_args},"
        f" C, {epi_fn}, {extra});\n"
    )
