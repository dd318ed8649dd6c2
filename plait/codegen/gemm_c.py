"""The C GEMM: a shape-generic library (register-blocked vector micro-kernels, per-thread packing, one parallel
loop of independent tasks) and the per-kernel wrapper that calls it with a GEMM's sizes, strides and epilogue.

The B operand is either a strided matrix or, for a convolution, the patch columns of an NCHW image that are
gathered straight into the packed panels (implicit GEMM: no im2col buffer). A is read in place when its rows are
contiguous (convolution and linear weights), so weights are streamed once instead of copied every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plait.codegen import simd

VW = simd.vector_width()  # floats per vector register: 16 with AVX-512, 8 with AVX2 (plait/codegen/simd.py)
# (MR, vectors per row) shapes of the register tile: about 24 accumulators of the 32 registers with AVX-512, 12 of the
# 16 with AVX2 or fewer (each tile also holds its row of B and a broadcast element of A)
TILES = ((24, 1), (12, 2), (8, 3), (6, 4)) if VW == 16 else ((12, 1), (6, 2), (4, 3))
KC_MAX = 256
# Static task schedules. The task loops of the cpu kernels (GEMM, GEMV, pointwise, depthwise, direct and Winograd
# convolutions) hand each thread a contiguous run of tasks (`schedule(static)`), not one task at a time: a thread then
# computes the same part of an output in every replay, and often of consecutive layers, so it finds more of what it
# wrote in its own cache instead of fetching it from the other core's. Two threads at SCHED_FIFO, replays interleaved in one process: mobilenet_v2 b1
# 9.84 -> 8.97 and 9.44 -> 8.72 ms, resnet18 b1 23.73 -> 22.96 ms (docs/benchmarks.md, "why plait scales worse").
# A task whose columns are at most NARROW_COLS (a 7x7 or 14x14 plane at batch 1) takes k blocks of up to KC_NARROW,
# so a 3x3 convolution over 512 channels runs its whole depth in one block: every row of A is then read as one long
# run. One-thread CPU time of resnet50's products over k 1024-4608 with 49-196 columns, interleaved: 4-13% less with
# blocks of 1024 than of 256, 512 x 49 x 4608 another 6-9% less with one block of 4608 (docs/benchmarks.md).
KC_NARROW, NARROW_COLS = 4608, 128
# A task's column chunk: at most CPAN_MAX panels of the register tile (8 x 48 columns: 384). 4 and 12 measured no
# better than 8 on the Zen 5 host (1 MB L2), nor KC_MAX 128, 192 or 384 against 256 (docs/benchmarks.md).
CPAN_MAX = 8
# With fewer column chunks than 4 per thread, a product shrinks its chunks (down to 2 panels) before it splits rows,
# but only while A has at most SHRINK_A_FLOATS floats (512 KB, the Zen 3 host's L2): every column task reads all of
# A, so a larger A (resnet50's layer3 and layer4 weights at batch 1: 1-9 MB) was streamed from L3 once per chunk;
# split rows stream it once per thread. resnet50 b1, two threads, `bench_far_ab.py` against a control plan: replays
# 0.871 and 0.957 of the old rule's (controls 0.993 and 0.984), 1024x196x256 x 6 5.83-6.47 -> 4.85-5.19 ms; resnet18
# b1 0.958 (control 1.009); mobilenet_v2, alexnet b1 and resnet50 b16 level (docs/benchmarks.md).
SHRINK_A_FLOATS = 1 << 17
# Software prefetches for operands that come from L3 or memory in short runs the hardware prefetcher misses (locality
# hint, 0 = none): A_AHEAD fetches the next row block of A (weights, read in place) while the current one meets its
# panels; PACK_AHEAD is how many channels ahead the packing of a 1x1 window's patch columns (a strided downsample)
# fetches its input rows. resnet50 b1 on the Zen 5 host, one thread, in-plan thread CPU time: the 56x56 stride-2 1x1
# 1.42 -> 1.07-1.10 ms, 512x784x128 products 0.58 -> 0.56 ms (docs/benchmarks.md, "resnet50's GEMMs on Zen 5").
A_AHEAD = 3
PACK_AHEAD = 4
# A partial last panel of at most TAIL_VECTORS vectors' columns runs on a micro-kernel of its width (reading the same
# packed panel), not on the whole tile multiplying zero columns: 784 = 16 x 48 + 16 columns (resnet50's 28x28 layers)
# cost 17 panels' work and split 9 : 8 panels between two threads. Two threads (FIFO, median wall, resnet50 b1 on the
# Zen 5 host): the 784-column products 3-7% faster, the net's GEMM kernels 7.49 -> 7.29 ms (docs/benchmarks.md).
TAIL_VECTORS = 1
# A task that packs its own panels of a row-contiguous B (a 1x1 convolution's image, stride 1) packs its whole panels
# inside its first row block's micro-kernels, which read B where it lies and store each row as they load it: the
# copy's loads and stores then overlap that block's multiply-adds instead of running as a phase of their own.
# resnet50 b1 on the Zen 5 guest, one thread against controls: 64x3136x256 0.534-0.541 -> 0.508-0.512 ms, 128x784x512
# 0.483-0.491 -> 0.465-0.470; two threads, both build orders: those steps 0.03-0.06 ms faster, replays 0.99 of the
# unfused plan's (docs/benchmarks.md, thirteenth session). In the k-split driver it gained nothing (512x49x2048).
FUSE_PACK = True
MERGE_BELOW = 512  # products with fewer columns than this that share A over a batch merge the batch's columns
FRINGE_MAX = 4  # at most this many columns past the last whole panel run as dot products (plait_fringe)


# Rows split between threads share one packing of B, which each thread writes half of and reads all of. When the
# two vCPUs sit on different CCDs (no shared L3) every line of it crosses between them twice a call: read after the
# other thread wrote it, and written again next call while the other still holds a copy (~1.2 and ~5 ns a line more
# than a local line, benchmarks/bench_far_ab.py). A product whose packed B is much larger than C (resnet50's layer4
# 3x3: B 4608 x 48 packed, C 512 x 49) instead splits k between the threads: each packs and multiplies its own share
# of k in private buffers, and the partial products (C's size) are summed once, each thread owning half of C's rows
# (its product goes there directly, the other's partial is added) and running their epilogue. resnet50 b1 two
# threads, benchmarks/bench_far_ab.py: far placement 21.99 -> 21.47 ms (the layer4 3x3s 2.42 -> 2.07 ms), near
# 18.70 -> 18.60 ms. Splitting k also for column-split products with k x npad > 4.5 m x n (resnet50's 256x196x1024)
# lost: near +1.3%, far -2.0% against -2.4% without (docs/benchmarks.md).
KSPLIT = True
# A weight that is constant in a plan (a parameter, an ONNX initializer, a weight with batch norm folded in) is packed
# once, at plan build, in the register tile's order (APack): panels of MR rows, element (i, p) of a panel at
# p * MR + i, zero past m. The micro-kernel's broadcasts then read one sequential stream instead of MR rows k apart,
# which the hardware prefetcher follows when the weights come from memory, as they do in every replay of a net whose
# weights exceed L3. A standalone C test of the 6 x 16 tile (weights cold, one thread, the Zen 3 guest, interleaved,
# medians): resnet50's 1x1 shapes 57-76 -> 65-84 GFLOP/s (+9 to +18%), its 3x3 over 4608 channels unchanged
# (docs/benchmarks.md, fifteenth session).
APACK = True
# The task loops of the GEMM, stride-2, Winograd and fused mobilenet-block kernels hand out static shares with stealing
# (plait_steal_start / plait_steal_next): a thread that finished its share takes the last unstarted tasks of a
# teammate's, instead of waiting at the next barrier for a thread the host slowed down. The guest's CPU 0 takes its
# virtio interrupts and ran resnet50 1.4-6% slower than CPU 1 at one thread. Paired rounds, two threads,
# `bench_kernel_pairs.py resnet50 --b TASK_STEAL=False`: plain static shares took 1.034 (b1) and 1.056 (b16) of the
# stealing loops' time over the 33 GEMM kernels by geometric mean (controls 0.991, 1.008), 1.114 over the 13 Winograd
# kernels at b1 (control 0.997). resnet50 b1 team replays, both plans in one process (`bench_team_steps.py --ab`):
# 61.29 against 64.05 ms and 61.23 against 62.60, step imbalance 3.3 against 5.6-5.8 ms (docs/benchmarks.md,
# eighteenth session).
TASK_STEAL = True


def steal_loop(var: str, count: str, name: str = "st", cond: str = "1") -> str:
    """The head of a task loop over `var` in [0, count) with static shares and stealing (TASK_STEAL, and where the C
    condition `cond` holds), in place of `#pragma omp for schedule(static) nowait` and its `for`: every thread of the
    team must run it. `name` is its state's variable, distinct for loops in one block."""
    return (
        f"plait_steal_t {name};\n  plait_steal_start(&{name}, {count}, {int(TASK_STEAL)} && ({cond}));\n"
        f"  for (long {var}; ({var} = plait_steal_next(&{name})) >= 0;)"
    )


@dataclass(frozen=True)
class APack:
    """The packing of a constant A (m x k, read through the weight view: offset, row stride, column stride) for the
    register tile `mr` x `nv` vectors; the extra VW floats let plait_fringe_packed read whole vectors past the
    last panel."""

    m: int
    k: int
    mr: int
    nv: int
    w_view: tuple[int, int, int]

    def __post_init__(self) -> None:
        assert -(-self.mr // VW) <= 3, "plait_fringe_packed holds at most 3 vectors of a panel's rows"

    @property
    def packed_size(self) -> int:
        return -(-self.m // self.mr) * self.mr * self.k + VW

    def render_pack(self) -> tuple[str, str]:
        """(name stem, C body) of the packing (pack_panels, panels of mr rows, VW zeros after them)."""
        return f"GEMMPACK_{self.m}x{self.k}x{self.mr}", pack_panels(self.m, self.k, self.mr, self.w_view, VW)


def pack_panels(m: int, k: int, panel: int, w_view: tuple[int, int, int], pad: int = 0) -> str:
    """The C body of a weight packing that runs once, when the plan is built: W (m x k, read through w_view: offset,
    row stride, column stride) as panels of `panel` rows, U[(r / panel * k + c) * panel + r % panel] = W[r, c], zero
    past m, then `pad` zeros (APack's, and the lanes kernels' packing: pointwise_c.LanesPlan)."""
    ao, sam, sak = w_view
    rows = -(-m // panel) * panel
    store = (
        f"    for (int c = 0; c < {k}; c++)\n"
        f"      U[((long)(r / {panel}) * {k} + c) * {panel} + r % {panel}] = r < {m} ?"
        f" W[{ao} + (long)r * {sam} + (long)c * {sak}] : 0.0f;\n"
    )
    loop = f"#pragma omp for schedule(static) nowait\n  for (int r = 0; r < {rows}; r++)"
    if not pad:
        return f"{loop}\n{store}"
    zeros = f"    if (r == 0)\n      for (int e = 0; e < {pad}; e++) U[{rows * k} + e] = 0.0f;\n"
    return f"{loop} {{\n{store}{zeros}  }}\n"


# The team size that cpu kernel choices are balanced for wherever a static split makes the busier thread the critical
# path: Winograd's register tiles (winograd_c.TEAM_SPLIT), the pointwise lanes tiles (pointwise_c.LANES_SPLIT), the
# stem's pooled bands (stem_pool_c.THREADS). Issue 8's cpu target runs 2 threads; kernels compute right at any count,
# only their balance is priced for this one (pricing by the run's own count would need measuring at other counts).
PRICED_THREADS = 2


def static_busiest(work: list[int], threads: int) -> int:
    """The busiest thread's work when OpenMP's static schedule (no chunk size) deals the tasks `work` out to
    `threads` threads, as libgomp does: contiguous runs, the first len(work) % threads threads one task more."""
    base, extra = divmod(len(work), threads)
    busiest, i = 0, 0
    for th in range(threads):
        n = base + (th < extra)
        busiest = max(busiest, sum(work[i : i + n]))
        i += n
    return busiest


GEMV_ROWS = 16  # at most this many rows run as a weight-streaming product when B is large ...
GEMV_B_ELEMENTS = 1 << 20  # ... at least this many elements (4 MB: out of L2, so reading it once is what counts)


def use_gemv(m: int, n: int, k: int, batch: int, sbk: int, sbn: int, small_m: int) -> bool:
    """True when a product without a convolution window runs as the few-rows GEMV (plait_sgemv): at most `small_m`
    rows, or up to GEMV_ROWS rows of one product whose B (a linear layer's weight, either layout) is too large to
    stay in cache, so the GEMM's per-call packing of B would cost as much as the multiply-adds."""
    if m <= small_m:
        return True
    return m <= GEMV_ROWS and batch == 1 and n * k >= GEMV_B_ELEMENTS and 1 in (sbk, sbn)


# CPU time of one padded multiply-add per register tile, relative to the best tile on the same product: the median
# over the 31 pointwise (1x1) products of mobilenet_v2 and resnet50 at batch 1, two runs of
# `benchmarks/bench_tiles_c.py` on one thread (docs/benchmarks.md). The one- and two-vector-wide tiles lose even where
# they pad least (resnet50's 1024x196x256: 24x16 1.8x slower than 8x48), so padding alone picks badly.
# With 8-float vectors (AVX2): the micro-kernel alone on the Zen 3 guest, one thread, kc 256 in L1 (docs/benchmarks.md,
# "the vector width follows the host"): 12x1 70, 6x2 84, 4x3 64 GFLOP/s.
TILE_COST = (
    {(24, 1): 1.67, (12, 2): 1.31, (8, 3): 1.02, (6, 4): 1.05}
    if VW == 16
    else {(12, 1): 1.25, (6, 2): 1.0, (4, 3): 1.35}
)


def pick_tile(m: int, n: int) -> tuple[int, int]:
    """The register tile with the least measured cost on an m x n product: padded work (whole tiles; up to
    FRINGE_MAX columns past the last whole panel as dot products) times the tile's relative cost per multiply-add
    (TILE_COST)."""

    def cost(t: tuple[int, int]) -> float:
        mr, nv = t
        nr = nv * VW
        rem = n % nr
        # a fringe column costs about two of a panel's (dot products are bound by loads, not multiply-adds)
        cols = n - rem + (2 * rem if rem <= FRINGE_MAX else nr)
        return (-(-m // mr) * mr) * cols * TILE_COST[t]

    return min(TILES, key=cost)


def epi_prefetch(names: list[str], m: int, n: int) -> str:
    """Statements for a GEMM epilogue (`epi_...(c, bz, i0, j0, mr, nr, extra)`) that prefetch the next row block's
    elements of the operands `names`, each read at C's own element index (a residual). The driver runs the
    epilogue on a row block right after its products, so the next block's lines come from L3 while that block's
    products run, instead of being waited for in its epilogue."""
    if not names:
        return ""
    lines = "".join(f"      __builtin_prefetch({e} + o + j);\n" for e in names)
    return (
        f"  for (int i = i0 + mr; i < i0 + 2 * mr && i < {m}; i++) {{\n"
        f"    long o = bz * {m * n}L + (long)i * {n} + j0;\n"
        f"    for (int j = 0; j < nr; j += {VW}) {{\n{lines}    }}\n  }}\n"
    )


# Library code is compiled at -O2: its hot loops are explicit vector types, `#pragma GCC unroll` and `omp simd`, which
# -O2 compiles to the same inner loops as -O3 in half the compile time (the kernels around it keep -O3).
def at_o2(block: str) -> str:
    """A `//@shared-begin ... //@shared-end` block with its body compiled at -O2."""
    head, _, rest = block.partition("\n")
    body, end, tail = rest.rpartition("//@shared-end")
    return f'{head}\n#pragma GCC push_options\n#pragma GCC optimize("O2")\n{body}#pragma GCC pop_options\n{end}{tail}'


_COMMON_SRC = """//@shared-begin plait_gemm_common
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#define PLAIT_VW @VW@ /* floats per vector register (plait/codegen/simd.py) */
typedef float plait_vf __attribute__((vector_size(PLAIT_VW * 4), aligned(4)));
typedef void (*plait_epi_fn)(float* c, long bz, int i0, int j0, int mr, int nr, void* const* extra);
/* The patch geometry of an implicit-GEMM B operand: row k = (channel, ky, kx), column j = (oy, ox). */
typedef struct { int h, w, kh, kw, sh, sw, ph, pw, dh, dw, ow; } plait_win;

/* A per-thread buffer that only grows: packing needs no allocation (and no page faults) per call. */
static float* plait_scratch(size_t n) {
  static __thread float* buf;
  static __thread size_t cap;
  if (n > cap) {
    free(buf);
    buf = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    cap = n;
  }
  return buf;
}

/* The calling thread's buffer for operands that all threads of one call share (kept apart from plait_scratch,
   which the same thread uses inside the parallel region). */
static float* plait_shared_scratch(size_t n) {
  static __thread float* buf;
  static __thread size_t cap;
  if (n > cap) {
    free(buf);
    buf = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    cap = n;
  }
  return buf;
}

/* A task loop's static shares with stealing: thread t owns tasks [n*t/T, n*(t+1)/T) and takes them from the front;
   a thread whose share is done takes the last unstarted task of a teammate's share, so a thread slowed by the host
   (interrupts, another process) is helped instead of waited for. One claim word per thread (tag, next, end), the
   tag being the thread's count of such loops: every thread of a team passes through them in the same order, so a
   word is only ever taken from within the same loop. A thread whose tag differs (a team of another size ran in
   between) just runs its own share. steal 0: the plain static shares. */
#define PLAIT_STEAL_MAX 16
static struct { unsigned long w; char pad[56]; } plait_claims[PLAIT_STEAL_MAX] __attribute__((aligned(64)));
static __thread unsigned long plait_claim_tag;
typedef struct { unsigned long tag; long lo, hi; int me, threads, steal; } plait_steal_t;
static inline unsigned long plait_claim_word(unsigned long tag, long next, long end) {
  return tag << 40 | (unsigned long)next << 20 | (unsigned long)end;
}
static void plait_steal_start(plait_steal_t* s, long n, int steal) {
  int threads = omp_get_num_threads(), me = omp_get_thread_num();
  s->threads = threads, s->me = me, s->lo = n * me / threads, s->hi = n * (me + 1) / threads;
  s->steal = steal && threads > 1 && threads <= PLAIT_STEAL_MAX && n < (1L << 20);
  if (s->steal) {
    s->tag = ++plait_claim_tag & 0xFFFFFF;
    __atomic_store_n(&plait_claims[me].w, plait_claim_word(s->tag, s->lo, s->hi), __ATOMIC_RELEASE);
  }
}
static long plait_steal_next(plait_steal_t* s) {
  if (!s->steal) return s->lo < s->hi ? s->lo++ : -1;
  for (int k = 0; k < s->threads; k++) {
    unsigned long* word = &plait_claims[(s->me + k) % s->threads].w;
    unsigned long w = __atomic_load_n(word, __ATOMIC_ACQUIRE);
    for (;;) {
      long next = (long)(w >> 20 & 0xFFFFF), end = (long)(w & 0xFFFFF);
      if (w >> 40 != s->tag || next >= end) break;
      /* its own share from the front, a teammate's from the back */
      unsigned long nw = k ? plait_claim_word(s->tag, next, end - 1) : plait_claim_word(s->tag, next + 1, end);
      if (__atomic_compare_exchange_n(word, &w, nw, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return k ? end - 1 : next;
    }
  }
  return -1;
}

/* Rows [pc, pc+kc) and columns [j0, j1) of a strided B into panels of nr columns (bp[panel][p][j], panels ldp rows
   apart: a k block packed in parts has ldp > kc); column j lands at panel position pos + j - j0, columns past n are
   zero. Row-contiguous B is copied row by row, each row across all the panels; any other column by column (a
   transposed B is then read sequentially, one page at a time). */
static void plait_pack_b(const float* b, long sbk, long sbn, int pc, int kc, int ldp, int j0, int j1, int n, int nr,
                         float* bp, int pos) {
  if (sbn == 1) {
    /* each row's columns are one contiguous run, which the hardware prefetcher follows; panel by panel, every row
       gave a few lines of another page, each a miss waited for when B comes from L3 */
    int je = j1 < n ? j1 : n;
    for (int p = 0; p < kc; p++) {
      const float* s = b + (long)(pc + p) * sbk;
      if (p + 4 < kc) /* four rows ahead: each row's run starts a new stream, which the prefetcher meets late */
        for (int j = j0; j < je; j += 16) __builtin_prefetch(s + 4 * sbk + j);
      for (int j = j0; j < j1;) {
        int t = pos + j - j0, pj = t % nr, run = nr - pj;
        if (j1 - j < run) run = j1 - j;
        float* d = bp + (long)(t - pj) * ldp + pj + (long)p * nr;
        int w = n - j < run ? (n - j > 0 ? n - j : 0) : run;
        if (w == nr && nr % PLAIT_VW == 0) { /* a whole panel's row by vector moves, not a memcpy call */
          for (int q = 0; q < nr; q += PLAIT_VW) *(plait_vf*)(d + q) = *(const plait_vf*)(s + j + q);
        } else {
          memcpy(d, s + j, sizeof(float) * w);
          for (int q = w; q < run; q++) d[q] = 0.0f;
        }
        j += run;
      }
    }
    return;
  }
  for (int j = j0; j < j1;) {
    int t = pos + j - j0, pj = t % nr, run = nr - pj;
    if (j1 - j < run) run = j1 - j;
    float* d = bp + (long)(t - pj) * ldp + pj;
    int w = n - j < run ? (n - j > 0 ? n - j : 0) : run;
    for (int q = 0; q < run; q++) {
      const float* col = b + (long)(j + q) * sbn + (long)pc * sbk;
      if (q < w) for (int p = 0; p < kc; p++) d[(long)p * nr + q] = col[(long)p * sbk];
      else for (int p = 0; p < kc; p++) d[(long)p * nr + q] = 0.0f;
    }
    j += run;
  }
}

/* The same panels gathered from an image (channels x h x w): column j reads output position (j / ow, j % ow).
   The columns split once into runs that stay inside one panel and one output row; for every row k of the patch
   matrix each run is then one strided run of an input row: zero padding and a copy, with no division. */
static void plait_pack_win(const float* x, const plait_win* g, int pc, int kc, int ldp, int j0, int j1, int n, int nr,
                           float* bp, int pos) {
  int kk = g->kh * g->kw, hw = g->h * g->w, s = g->sw, nseg = 0;
  int sdst[j1 - j0 + 1], slen[j1 - j0 + 1], soy[j1 - j0 + 1], sox[j1 - j0 + 1];
  for (int j = j0; j < j1;) {
    int t = pos + j - j0, pj = t % nr, run = nr - pj;
    if (j1 - j < run) run = j1 - j;
    sdst[nseg] = (t - pj) * ldp + pj;
    if (j >= n) {
      soy[nseg] = -1;
    } else {
      soy[nseg] = j / g->ow, sox[nseg] = j % g->ow;
      if (g->ow - sox[nseg] < run) run = g->ow - sox[nseg];
      if (n - j < run) run = n - j;
    }
    slen[nseg++] = run;
    j += run;
  }
  int ci = pc / kk, ky = pc % kk / g->kw, kx = pc % g->kw;
  for (int p = 0; p < kc; p++) {
    const float* xc = x + (long)ci * hw;
    int dy = ky * g->dh - g->ph, dx = kx * g->dw - g->pw;
    /* a 1x1 window: row p of the patch matrix is channel pc + p; the rows it reads a few channels ahead (stride 2:
       runs of a few lines, rows apart, which the hardware prefetcher follows too late) */
    if (@PACK_AHEAD@ && kk == 1 && p + @PACK_AHEAD@ < kc)
      for (int e = 0; e < nseg; e++) {
        if (soy[e] < 0) continue;
        const float* r = xc + @PACK_AHEAD@ * (long)hw + (long)(soy[e] * g->sh + dy) * g->w + sox[e] * s + dx;
        for (int q = 0; q < slen[e] * s; q += 16) __builtin_prefetch(r + q);
      }
    for (int e = 0; e < nseg; e++) {
      float* d = bp + sdst[e] + (long)p * nr;
      int run = slen[e], iy = soy[e] * g->sh + dy;
      if (soy[e] < 0 || iy < 0 || iy >= g->h) {
        memset(d, 0, sizeof(float) * run);
        continue;
      }
      const float* xr = xc + (long)iy * g->w;
      int ix0 = sox[e] * s + dx, lo, hi;
      if (s == 1) {
        lo = ix0 >= 0 ? 0 : -ix0;
        hi = g->w - ix0;
      } else if (s == 2) { /* shifts, not a division per run and row */
        lo = ix0 >= 0 ? 0 : (1 - ix0) >> 1;
        hi = ix0 >= g->w ? 0 : ((g->w - 1 - ix0) >> 1) + 1;
      } else {
        lo = ix0 >= 0 ? 0 : (-ix0 + s - 1) / s;
        hi = ix0 >= g->w ? 0 : (g->w - 1 - ix0) / s + 1;
      }
      if (lo > run) lo = run;
      if (hi > run) hi = run;
      if (hi < lo) hi = lo;
      for (int q = 0; q < lo; q++) d[q] = 0.0f;
      if (s == 1) {
        memcpy(d + lo, xr + ix0 + lo, sizeof(float) * (hi - lo));
      } else if (s == 2) { /* a constant stride: even elements of vector pairs instead of scalar copies */
        const float* xs = xr + ix0;
#pragma omp simd
        for (int q = lo; q < hi; q++) d[q] = xs[2 * q];
      } else {
        for (int q = lo; q < hi; q++) d[q] = xr[ix0 + q * s];
      }
      for (int q = hi; q < run; q++) d[q] = 0.0f;
    }
    if (++kx == g->kw) {
      kx = 0;
      if (++ky == g->kh) { ky = 0; ci++; }
    }
  }
}

/* Panels for columns [g0, g1) of B: with `images` > 0 the columns of all images side by side (column g is column
   g % n of image g / n; past the last image, zeros), else of the one B at `b`. */
static void plait_pack(const float* b, long sbb, long sbi, long inner, long images, long sbk, long sbn,
                       const plait_win* win, int pc, int kc, int ldp, long g0, long g1, int n, int nr, float* bp) {
  if (!images) {
    if (win) plait_pack_win(b, win, pc, kc, ldp, (int)g0, (int)g1, n, nr, bp, 0);
    else plait_pack_b(b, sbk, sbn, pc, kc, ldp, (int)g0, (int)g1, n, nr, bp, 0);
    return;
  }
  for (long g = g0; g < g1;) {
    long img = g / n < images ? g / n : images - 1;
    long end = img == images - 1 || (img + 1) * n > g1 ? g1 : (img + 1) * n;
    int j = (int)(g - img * n), j1 = (int)(end - img * n);
    const float* x = b + img / inner * sbb + img % inner * sbi;
    if (win) plait_pack_win(x, win, pc, kc, ldp, j, j1, n, nr, bp, (int)(g - g0));
    else plait_pack_b(x, sbk, sbn, pc, kc, ldp, j, j1, n, nr, bp, (int)(g - g0));
    g = end;
  }
}
//@shared-end
"""


def common() -> str:
    """The packing library with PACK_AHEAD substituted (COMMON is this at import; benchmarks re-render it after
    changing the constant)."""
    return _COMMON_SRC.replace("@PACK_AHEAD@", str(PACK_AHEAD)).replace("@VW@", str(VW))


COMMON = common()


# Columns past the last whole panel of the register tile, when there are a few (a 7x7 or 14x14 plane at batch 1: 49 =
# 48 + 1, 196 = 192 + 4 columns), run as dot products along k instead of as one more panel padded with zeros (up to
# 47 wasted columns of multiply-adds). Their partial sums (vectors along k) stay in a per-thread buffer across k
# blocks and are summed into C at the last one.
FRINGE = """//@shared-begin plait_gemm_fringe
/* Four rows ar[i] (a row past the block repeats the last one) times R <= 4 columns of B held along k (fb, ldf
   apart, zero past kc) over kc elements: part[i * 4 + q] (PLAIT_VW lanes along k) accumulates row i, column q. */
static inline __attribute__((always_inline)) void plait_fringe_rows(int R, int kc, const float* const* ar,
                                                                  const float* fb, long ldf, plait_vf* part) {
  plait_vf acc[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
    for (int q = 0; q < R; q++) acc[i][q] = part[i * 4 + q];
  int k16 = kc / PLAIT_VW * PLAIT_VW;
  for (int p = 0; p <= k16; p += PLAIT_VW) {
    plait_vf av[4], bv[4];
    if (p == k16) { /* the last kc % PLAIT_VW elements: A's rows end there, so they are copied into zeroed vectors */
      if (p == kc) break;
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) {
        av[i] = (plait_vf){0};
        memcpy(&av[i], ar[i] + p, sizeof(float) * (size_t)(kc - p));
      }
    } else {
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) av[i] = *(const plait_vf*)(ar[i] + p);
    }
#pragma GCC unroll 4
    for (int q = 0; q < R; q++) bv[q] = *(const plait_vf*)(fb + q * ldf + p);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
      for (int q = 0; q < R; q++) acc[i][q] += av[i] * bv[q];
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
    for (int q = 0; q < R; q++) part[i * 4 + q] = acc[i][q];
}

/* Rows [pc, pc + kc) of B's columns jf .. jf + R - 1 (a strided matrix, or the patch columns of an image when g is
   set) along k into fb (column q at fb + q * ldf), zero past kc and for q >= R: the fringe columns are gathered
   straight from B instead of packed into a panel of their own and transposed. */
static void plait_fringe_cols(const float* b, long sbk, long sbn, const plait_win* g, int pc, int kc, long jf, int R,
                              float* fb, long ldf) {
  for (int q = 0; q < 4; q++) {
    float* d = fb + q * ldf;
    long j = jf + q;
    if (q >= R) {
      memset(d, 0, sizeof(float) * (size_t)ldf);
      continue;
    }
    if (!g) {
      for (int p = 0; p < kc; p++) d[p] = b[(long)(pc + p) * sbk + j * sbn];
    } else {
      int kk = g->kh * g->kw, ci = pc / kk, ky = pc % kk / g->kw, kx = pc % g->kw;
      int y0 = (int)(j / g->ow) * g->sh - g->ph, x0 = (int)(j % g->ow) * g->sw - g->pw;
      for (int p = 0; p < kc; p++) {
        int iy = y0 + ky * g->dh, ix = x0 + kx * g->dw;
        d[p] = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w ? b[((long)ci * g->h + iy) * g->w + ix] : 0.0f;
        if (++kx == g->kw) {
          kx = 0;
          if (++ky == g->kh) { ky = 0; ci++; }
        }
      }
    }
    for (long p = kc; p < ldf; p++) d[p] = 0.0f;
  }
}

/* The fringe of a row block of A packed at plan build (plait_apack: element (i, p) at a[p * pm + i]): each k's pm
   rows are NV vectors (lanes past pm hold the next k's rows and are never stored) times each of the R columns'
   element, broadcast; part[v * 4 + q] accumulates rows v * PLAIT_VW.. of column q. */
static inline __attribute__((always_inline)) void plait_fringe_packed(int R, int NV, int kc, const float* a, int pm,
                                                                    const float* fb, long ldf, plait_vf* part) {
  plait_vf acc[3][4];
#pragma GCC unroll 3
  for (int v = 0; v < NV; v++)
#pragma GCC unroll 4
    for (int q = 0; q < R; q++) acc[v][q] = part[v * 4 + q];
  for (int p = 0; p < kc; p++) {
    const float* ap = a + (long)p * pm;
#pragma GCC unroll 4
    for (int q = 0; q < R; q++) {
      float b = fb[q * ldf + p];
#pragma GCC unroll 3
      for (int v = 0; v < NV; v++) acc[v][q] += *(const plait_vf*)(ap + v * PLAIT_VW) * b;
    }
  }
#pragma GCC unroll 3
  for (int v = 0; v < NV; v++)
#pragma GCC unroll 4
    for (int q = 0; q < R; q++) part[v * 4 + q] = acc[v][q];
}

/* Rows [0, mr) of A (a, lda apart; lda 0: packed in panels of pm rows) times the R fringe columns of B for one k
   block; at the first block the partial sums start from zero, at the last they are summed into C (c, element (i, q)
   at i * rs + q * cs; last 2: added to C), row i scaled by sc[i] when sc is set. */
static void plait_fringe(int R, int kc, const float* a, long lda, int pm, const float* fb, long ldf, plait_vf* part,
                         int first, int last, float* c, long rs, long cs, int mr, const float* sc) {
  if (first) memset(part, 0, sizeof(plait_vf) * 4 * (size_t)((mr + 3) / 4 * 4));
  if (!lda) {
    int nv = (pm + PLAIT_VW - 1) / PLAIT_VW;
#define PLAIT_FP(r, v) case (r) * 4 + (v): plait_fringe_packed(r, v, kc, a, pm, fb, ldf, part); break;
    switch (R * 4 + (nv < 3 ? nv : 3)) {
      PLAIT_FP(1, 1) PLAIT_FP(1, 2) PLAIT_FP(1, 3) PLAIT_FP(2, 1) PLAIT_FP(2, 2) PLAIT_FP(2, 3)
      PLAIT_FP(3, 1) PLAIT_FP(3, 2) PLAIT_FP(3, 3) PLAIT_FP(4, 1) PLAIT_FP(4, 2) PLAIT_FP(4, 3)
    }
#undef PLAIT_FP
    if (!last) return;
    for (int i = 0; i < mr; i++)
      for (int q = 0; q < R; q++) {
        float sum = part[i / PLAIT_VW * 4 + q][i % PLAIT_VW];
        if (sc) sum *= sc[i];
        c[i * rs + q * cs] = last > 1 ? c[i * rs + q * cs] + sum : sum;
      }
    return;
  }
  for (int i0 = 0; i0 < mr; i0 += 4) {
    const float* ar[4];
    for (int i = 0; i < 4; i++) ar[i] = a + (long)(i0 + i < mr ? i0 + i : mr - 1) * lda;
    plait_vf* pt = part + i0 * 4;
    switch (R) {
      case 1: plait_fringe_rows(1, kc, ar, fb, ldf, pt); break;
      case 2: plait_fringe_rows(2, kc, ar, fb, ldf, pt); break;
      case 3: plait_fringe_rows(3, kc, ar, fb, ldf, pt); break;
      default: plait_fringe_rows(4, kc, ar, fb, ldf, pt); break;
    }
  }
  if (!last) return;
  for (int i = 0; i < mr; i++)
    for (int q = 0; q < R; q++) {
      float sum = 0.0f;
      for (int l = 0; l < PLAIT_VW; l++) sum += part[i * 4 + q][l];
      if (sc) sum *= sc[i];
      c[i * rs + q * cs] = last > 1 ? c[i * rs + q * cs] + sum : sum;
    }
}
//@shared-end
"""


def _micro(mr: int, nv: int, pnv: int = 0) -> str:
    """C[mr x nr] (+)= A[mr x kc] @ Bpanel[kc x nr] with the accumulators in registers; partial tiles (rows or
    columns past the matrix) are computed in full and stored element by element. plait_micro_sc_ scales row i of
    the product by sc[i] before it is stored (C holding a residual that a batch norm's scale must not touch).
    With `pnv`, the kernel covers the first nv vectors of a panel pnv vectors wide (a matrix's last, partial panel:
    plait_micro_{mr}x{nv}of{pnv})."""
    nr = nv * VW
    t = f"{mr}x{nv}" if not pnv else f"{mr}x{nv}of{pnv}"
    pnr = (pnv or nv) * VW
    return f"""static inline __attribute__((always_inline)) void plait_microx_{t}(int kc, const float* restrict a, long lda,
    const float* restrict bp, float* restrict c, long rs, long cs, int mr, int nr, int add, const float* sc,
    int fuse, const float* restrict src, long ldb, float* restrict pk, int apk) {{
  plait_vf acc[{mr}][{nv}];
#pragma GCC unroll {mr}
  for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) acc[i][v] = (plait_vf){{0}};
  if (apk == 2) /* (a compile-time constant) A packed in blocks of VW columns, element (i, p) at
                   a[p / VW * VW * mr + i * VW + p % VW] (winograd_c's U) */
    for (int p0 = 0; p0 < kc; p0 += {VW}) {{
      const float* ab = a + p0 * {mr};
      const int pe = kc - p0 < {VW} ? kc - p0 : {VW};
      for (int q = 0; q < pe; q++) {{
        plait_vf b[{nv}];
#pragma GCC unroll {nv}
        for (int v = 0; v < {nv}; v++) b[v] = *(const plait_vf*)(bp + (p0 + q) * {pnr} + v * {VW});
#pragma GCC unroll {mr}
        for (int i = 0; i < {mr}; i++) {{
          float ai = ab[i * {VW} + q];
#pragma GCC unroll {nv}
          for (int v = 0; v < {nv}; v++) acc[i][v] += b[v] * ai;
        }}
      }}
    }}
  else
  for (int p = 0; p < kc; p++) {{
    plait_vf b[{nv}];
    if (fuse) {{ /* (a compile-time constant) B read where it lies, row p at src + p * ldb, and packed on the way */
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) b[v] = *(const plait_vf*)(src + p * ldb + v * {VW});
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) *(plait_vf*)(pk + p * {pnr} + v * {VW}) = b[v];
    }} else {{
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) b[v] = *(const plait_vf*)(bp + p * {pnr} + v * {VW});
    }}
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++) {{
      float ai = apk ? a[p * {mr} + i] : a[i * lda + p]; /* (apk, a compile-time constant: A packed, plait_apack) */
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) acc[i][v] += b[v] * ai;
    }}
  }}
  if (sc) {{
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++) {{
      float s = sc[i < mr ? i : 0];
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) acc[i][v] *= s;
    }}
  }}
  if (mr == {mr} && nr == {nr} && cs == 1) {{
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) {{
        plait_vf* dst = (plait_vf*)(c + i * rs + v * {VW});
        *dst = add ? *dst + acc[i][v] : acc[i][v];
      }}
  }} else {{ /* a partial or transposed tile: vector stores to the stack, then element runs (acc is never indexed
    by a variable, so it stays in registers: indexing it spilled all accumulators to the stack on every call) */
    float tmp[{mr * nr}] __attribute__((aligned(64)));
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) *(plait_vf*)(tmp + i * {nr} + v * {VW}) = acc[i][v];
    for (int i = 0; i < mr; i++) {{
      float* restrict ci = c + i * rs;
      const float* ti = tmp + i * {nr};
      if (cs != 1) {{
        for (int j = 0; j < nr; j++) ci[j * cs] = add ? ci[j * cs] + ti[j] : ti[j];
      }} else if (add) {{
#pragma omp simd
        for (int j = 0; j < nr; j++) ci[j] += ti[j];
      }} else {{
        memcpy(ci, ti, sizeof(float) * (size_t)nr);
      }}
    }}
  }}
}}

/* (lda 0: A packed at plan build, plait_apack's panels of {mr} rows: element (i, p) at a[p * {mr} + i]) */
static void plait_micro_{t}(int kc, const float* restrict a, long lda, const float* restrict bp, float* restrict c,
                            long rs, long cs, int mr, int nr, int add) {{
  if (lda) plait_microx_{t}(kc, a, lda, bp, c, rs, cs, mr, nr, add, 0, 0, 0, 0, 0, 0);
  else plait_microx_{t}(kc, a, lda, bp, c, rs, cs, mr, nr, add, 0, 0, 0, 0, 0, 1);
}}

static void plait_micro_sc_{t}(int kc, const float* restrict a, long lda, const float* restrict bp, float* restrict c,
                               long rs, long cs, int mr, int nr, int add, const float* sc) {{
  if (lda) plait_microx_{t}(kc, a, lda, bp, c, rs, cs, mr, nr, add, sc, 0, 0, 0, 0, 0);
  else plait_microx_{t}(kc, a, lda, bp, c, rs, cs, mr, nr, add, sc, 0, 0, 0, 0, 1);
}}
""" + (
        f"""
/* plait_micro_{t} (plait_micro_sc_{t} when sc is set) on a whole panel whose kc rows are read from B in place (src,
   ldb apart) and packed into pk as they are read (FUSE_PACK) */
static void plait_micro_pk_{t}(int kc, const float* restrict a, long lda, const float* restrict src, long ldb,
                               float* restrict pk, float* restrict c, long rs, long cs, int mr, int nr, int add,
                               const float* sc) {{
  if (lda && sc) plait_microx_{t}(kc, a, lda, 0, c, rs, cs, mr, nr, add, sc, 1, src, ldb, pk, 0);
  else if (lda) plait_microx_{t}(kc, a, lda, 0, c, rs, cs, mr, nr, add, 0, 1, src, ldb, pk, 0);
  else if (sc) plait_microx_{t}(kc, a, lda, 0, c, rs, cs, mr, nr, add, sc, 1, src, ldb, pk, 1);
  else plait_microx_{t}(kc, a, lda, 0, c, rs, cs, mr, nr, add, 0, 1, src, ldb, pk, 1);
}}
"""
        if not pnv
        else ""
    )


def _driver(mr: int, nv: int) -> str:
    """The GEMM loop for one register tile: independent (batch, row block, column block) tasks under one static
    parallel loop ("Static task schedules" above), each packing its own B panels, so no thread waits for another
    inside a call (except after the one shared packing of a narrow B whose rows are split between threads)."""
    nr = nv * VW
    t = f"{mr}x{nv}"
    return f"""/* Store a finished tile: micro-kernel result for columns [jj, jj + nr) of the merged column space (image
   g / n, column g % n), which may span images; tmp holds the tile between k blocks when it does. */
static void plait_tile_{t}(int kc, const float* at, long lda, const float* bp, float* C, long m, int n, int ii,
                           long jj, int mr, int nr, int add, int last, plait_epi_fn epi, void* const* extra,
                           const float* sc) {{
  long img = jj / n;
  int j = (int)(jj % n);
  if (j + nr <= n) {{
    float* c = C + img * m * n;
    if (sc) plait_micro_sc_{t}(kc, at, lda, bp, c + (long)ii * n + j, n, 1, mr, nr, add, sc + ii);
    else plait_micro_{t}(kc, at, lda, bp, c + (long)ii * n + j, n, 1, mr, nr, add);
    if (epi && last) epi(c, img, ii, j, mr, nr, extra);
    return;
  }}
  float tmp[{mr * nr}];
  for (int q = 0; q < nr;) {{
    long g = jj + q, im = g / n;
    int jl = (int)(g % n), w = n - jl < nr - q ? n - jl : nr - q;
    for (int i = 0; i < mr && add; i++) memcpy(tmp + i * {nr} + q, C + im * m * n + (long)(ii + i) * n + jl, 4 * w);
    q += w;
  }}
  if (sc) plait_micro_sc_{t}(kc, at, lda, bp, tmp, {nr}, 1, mr, {nr}, add, sc + ii);
  else plait_micro_{t}(kc, at, lda, bp, tmp, {nr}, 1, {mr}, {nr}, add);
  for (int q = 0; q < nr;) {{
    long g = jj + q, im = g / n;
    int jl = (int)(g % n), w = n - jl < nr - q ? n - jl : nr - q;
    float* c = C + im * m * n;
    for (int i = 0; i < mr; i++) memcpy(c + (long)(ii + i) * n + jl, tmp + i * {nr} + q, 4 * w);
    if (epi && last) epi(c, im, ii, jl, mr, w, extra);
    q += w;
  }}
}}

/* One product (batch 1) with k split between the team's threads (KSPLIT): thread t packs rows [k t / nth,
   k (t + 1) / nth) of B into its own buffer and multiplies them with the same columns of A. C's row blocks are dealt
   out to the threads as owners: an owner's product goes straight into C (added to C's entry value with acc), every
   other thread's into its own slab part + t m n (C's layout). After a barrier each owner adds the others' slabs to
   its rows and runs their epilogue, so each line of C is written by one thread only. */
static void plait_sgemm_ksplit_{t}(int m, int n, int k, const float* A, long sam, long sak, const float* B, long sbk,
                                   long sbn, const plait_win* win, float* C, long rs, long cs, int acc,
                                   plait_epi_fn epi, void* const* extra, int trans, long npad, int fr, long jf,
                                   long cols, float* part, int apk) {{
  int nth = omp_get_num_threads(), me = omp_get_thread_num(), blocks = (m + {mr - 1}) / {mr};
  int k0 = (int)((long)k * me / nth), kc = (int)((long)k * (me + 1) / nth) - k0;
  int o0 = (int)((long)blocks * me / nth) * {mr}, o1 = (int)((long)blocks * (me + 1) / nth) * {mr};
  if (o1 > m) o1 = m;
  long ldf = (kc + 15) / 16 * 16;
  float* mine = part + (size_t)me * m * n;
  float* bp = plait_scratch((size_t)kc * npad + (size_t)kc * {mr} + (fr ? (size_t)ldf * 4 + {(mr + 3) // 4 * 4 * 4 * VW} : 0));
  float* ap = bp + (size_t)kc * npad;
  float* fb = ap + (size_t)kc * {mr};
  plait_vf* fpart = (plait_vf*)(fb + (size_t)ldf * 4);
  long jend = fr ? jf : npad;
  plait_pack(B, 0, 0, 1, 0, sbk, sbn, win, k0, kc, kc, 0, jend, n, {nr}, bp);
  if (fr) plait_fringe_cols(B, sbk, sbn, win, k0, kc, jf, fr, fb, ldf);
  for (int ii = 0; ii < m; ii += {mr}) {{
    int mr = m - ii < {mr} ? m - ii : {mr}, own = ii >= o0 && ii < o1, add = own && acc;
    float* c = own ? C : mine;
    const float* at = apk ? A + (long)ii * k + (long)k0 * {mr} : A + (long)ii * sam + k0;
    long lda = apk ? 0 : sam;
    if (!apk && (sak != 1 || mr < {mr})) {{ /* rows not contiguous along k, or a partial last block: packed, zero-padded */
      for (int i = 0; i < {mr}; i++)
        for (int p = 0; p < kc; p++) ap[(long)i * kc + p] = i < mr ? A[(long)(ii + i) * sam + (long)(k0 + p) * sak] : 0.0f;
      at = ap;
      lda = kc;
    }}
    for (long jj = 0; jj < jend; jj += {nr}) {{
      int nr = cols - jj < {nr} ? (int)(cols - jj) : {nr};
      const float* panel = bp + jj * kc;
      if (0) {{}}
{_tail_calls(mr, nv, add="add", scaled=False)}      else plait_micro_{t}(kc, at, lda, panel, c + ii * rs + jj * cs, rs, cs, mr, nr, add);
    }}
    if (fr) plait_fringe(fr, kc, at, lda, {mr}, fb, ldf, fpart, 1, 1 << add, c + ii * rs + jf * cs, rs, cs, mr, 0);
  }}
  plait_team_barrier(); /* every slab is complete before any is summed */
  for (int i0 = o0; i0 < o1; i0 += {mr}) {{
    int rows = o1 - i0 < {mr} ? o1 - i0 : {mr};
    for (int t = 0; t < nth; t++) {{
      const float* p = part + (size_t)t * m * n;
      if (t == me) continue;
      for (int i = i0; i < i0 + rows; i++)
#pragma omp simd
        for (int j = 0; j < n; j++) C[i * rs + j * cs] += p[i * rs + j * cs];
    }}
    if (epi) {{
      if (trans) epi(C, 0, 0, i0, n, rows, extra);
      else epi(C, 0, i0, 0, rows, n, extra);
    }}
  }}
}}

/* C[bz] = A[bz] @ B[bz] for bz < batch (bz = outer * inner + inner index), element (i, j) at i*rs + j*cs
   (trans: the caller swapped A and B to compute C^T, which suits a narrow C); B is the patch columns of image
   bz when win is set. When every bz shares A and the images are narrow, their columns are merged into one wide
   product (the weights are streamed once for all images). epi runs on each finished tile while it is in cache.
   With acc, C holds a value on entry (a residual in its storage) that the product adds to, its row i scaled by
   sc[i] when sc is set (a batch norm's scale). */
static void plait_sgemm_{t}(long batch, long inner, int m, int n, int k, const float* A, long sab, long sai, long sam,
                            long sak, const float* B, long sbb, long sbi, long sbk, long sbn, const plait_win* win,
                            float* C, int trans, int acc, const float* sc, plait_epi_fn epi, void* const* extra,
                            int apk) {{
  long rs = trans ? 1 : n, cs = trans ? m : 1;
  long images = batch > 1 && n < {MERGE_BELOW} && !trans && sai == 0 && (sab == 0 || batch == inner) ? batch : 0;
  long cols = images ? batch * n : n, nb = images ? 1 : batch;
  long panels = (cols + {nr - 1}) / {nr};
  int blocks = (m + {mr - 1}) / {mr};
  long want = 4L * omp_get_num_threads(), cpan = panels < {CPAN_MAX} ? panels : {CPAN_MAX};
  /* more column tasks (down to 2 panels each) before rows split: split rows share one packing of all of B, which
     leaves L2 when B is large */
  while (cpan > 2 && (long)m * k <= {SHRINK_A_FLOATS}L && nb * ((panels + cpan - 1) / cpan) < want) cpan--;
  long ctasks = (panels + cpan - 1) / cpan;
  /* a task count the threads divide evenly (more column tasks, or when rows split more row tasks): the static
     schedule gave one of two threads 5 of 9 tasks (66 panels of 3136 columns; 3 x 3 over 196 columns) */
  int nth = omp_get_num_threads();
  while (nb * ctasks >= want && nb * ctasks % nth && ctasks < panels) ctasks++;
  long per = nb * ctasks;
  int rtasks = per >= want ? 1 : (int)((want + per - 1) / per);
  while (rtasks > 1 && per * rtasks % nth && rtasks < blocks) rtasks++;
  if (rtasks > blocks) rtasks = blocks;
  /* a narrow column chunk takes longer k blocks: its B stays small while the rows of A stream in longer runs */
  int kmax = cpan * {nr} <= {NARROW_COLS} ? {KC_NARROW} : {KC_MAX};
  int nkb = (k + kmax - 1) / kmax, kcm = (k + nkb - 1) / nkb;
  long tasks = per * rtasks, npad = panels * {nr};
  /* columns past the last whole panel, when few, are dot products (plait_fringe) instead of one more padded panel */
  int fr = !images && cols % {nr} && cols % {nr} <= {FRINGE_MAX} ? (int)(cols % {nr}) : 0;
  long jf = cols - fr, ldf = (kcm + 15) / 16 * 16;
  /* k split between the threads (KSPLIT) where split rows would share a packed B much larger than C */
  if ({int(KSPLIT)} && rtasks > 1 && nth > 1 && nb == 1 && !images && !sc && ctasks == 1 &&
      (long)k * npad > 2L * m * n && k >= 64 * nth) {{
    float* part = plait_team_shared((size_t)nth * m * n);
    if (!part) {{
#pragma omp single copyprivate(part)
      part = plait_shared_scratch((size_t)nth * m * n);
    }}
    plait_sgemm_ksplit_{t}(m, n, k, A, sam, sak, B, sbk, sbn, win, C, rs, cs, acc, epi, extra, trans, npad, fr, jf, cols, part, apk);
    return;
  }}
  /* split rows share one packing of B (per image: every k block, all panels) instead of each packing it again */
  float* shared = rtasks > 1 ? plait_team_shared((size_t)(nb * k * npad)) : 0; /* a team step: the run's buffer */
  if (rtasks > 1 && !shared) {{ /* run alone: one thread's buffer, its address given to the whole team */
#pragma omp single copyprivate(shared)
    shared = plait_shared_scratch((size_t)(nb * k * npad));
  }}
  {{ /* every thread of the team runs this block (its loops are orphaned worksharing: see plait/codegen/c.py) */
    if (shared) {{
      /* in parts of up to {KC_MAX} rows, so a long k block is packed by every thread, not by one */
      int parts = (kcm + {KC_MAX - 1}) / {KC_MAX};
#pragma omp for schedule(static) nowait
      for (long u = 0; u < nb * nkb * parts; u++) {{
        long bz = u / (nkb * parts);
        int pc = (int)(u / parts % nkb) * kcm, kc = k - pc < kcm ? k - pc : kcm, p0 = (int)(u % parts) * {KC_MAX};
        if (p0 >= kc) continue;
        int rows = kc - p0 < {KC_MAX} ? kc - p0 : {KC_MAX};
        const float* b = images ? B : B + bz / inner * sbb + bz % inner * sbi;
        plait_pack(b, sbb, sbi, inner, images, sbk, sbn, win, pc + p0, rows, kc, 0, fr ? jf : npad, n, {nr},
                   shared + bz * k * npad + pc * npad + (long)p0 * {nr});
      }}
      plait_team_barrier(); /* the packing is complete before any task reads it */
    }}
    {steal_loop("task", "tasks")} {{
      long bz = task / (ctasks * rtasks);
      int rt = (int)(task / ctasks % rtasks);
      long ct = task % ctasks;
      /* row blocks and panels dealt out evenly (at most cpan panels a task), so the static schedule's contiguous
         runs of tasks carry equal work */
      int i0 = (int)((long)blocks * rt / rtasks) * {mr}, i1 = (int)((long)blocks * (rt + 1) / rtasks) * {mr};
      long j0 = panels * ct / ctasks * {nr}, j1 = panels * (ct + 1) / ctasks * {nr};
      if (i1 > m) i1 = m;
      const float* a = A + bz / inner * sab + bz % inner * sai;
      const float* b = images ? B : B + bz / inner * sbb + bz % inner * sbi;
      float* c = C + bz * (long)m * n;
      int fringe = fr && j1 > jf;
      /* fringe partial sums: per row block of the task, its rows rounded up to 4, 4 vectors each */
      size_t nfb = fringe ? (size_t)ldf * 4 + (size_t)((i1 - i0 + {mr - 1}) / {mr}) * {(mr + 3) // 4 * 4 * 4 * VW} : 0;
      float* ap = plait_scratch((size_t)kcm * (j1 - j0) + (size_t)kcm * (i1 - i0 + {mr}) + nfb);
      float* bp = ap + (size_t)kcm * (i1 - i0 + {mr});
      float* fb = bp + (size_t)kcm * (j1 - j0);
      plait_vf* part = (plait_vf*)(fb + (size_t)ldf * 4);
      long jend = fringe ? jf : j1;
      /* FUSE_PACK: whole panels of a row-contiguous B, columns [j0, jw), are packed in every k block by the first row
         block's micro-kernels as they read them; the rest (a partial last panel) before them */
      long jw = {int(FUSE_PACK)} && !shared && !images && !win && sbn == 1 ? j0 + ((jend < n ? jend : n) - j0) / {nr} * {nr} : j0;
      for (int pc = 0; pc < k; pc += kcm) {{
        int kc = k - pc < kcm ? k - pc : kcm, last = pc + kc >= k;
        if (shared) bp = shared + bz * k * npad + pc * npad + j0 * kc;
        else if (jw > j0) {{
          if (jend > jw) plait_pack_b(b, sbk, sbn, pc, kc, kc, (int)jw, (int)jend, n, {nr}, bp, (int)(jw - j0));
        }} else plait_pack(b, sbb, sbi, inner, images, sbk, sbn, win, pc, kc, kc, j0, jend, n, {nr}, bp);
        /* rows are read in place when contiguous along k; else (and a partial last block) packed, zero-padded */
        int direct = sak == 1, packed_to = i1;
        if (!apk && (!direct || (i1 - i0) % {mr})) {{
          int from = direct ? i0 + (i1 - i0) / {mr} * {mr} : i0;
          int rows = (i1 - from + {mr - 1}) / {mr} * {mr};
          for (int i = 0; i < rows; i++)
            for (int p = 0; p < kc; p++)
              ap[(long)i * kc + p] = from + i < i1 ? a[(long)(from + i) * sam + (long)(pc + p) * sak] : 0.0f;
          packed_to = from;
        }}
        if (fringe) plait_fringe_cols(b, sbk, sbn, win, pc, kc, jf, fr, fb, ldf);
        /* a row block of A stays in L1 while it meets every panel; its finished rows then get the epilogue in
           one long pass while still in cache */
        for (int ii = i0; ii < i1; ii += {mr}) {{
          int mr = i1 - ii < {mr} ? i1 - ii : {mr};
          const float* at = apk ? a + (long)ii * k + (long)pc * {mr} : ii < packed_to ? a + (long)ii * sam + pc : ap + (long)(ii - packed_to) * kc;
          long lda = apk ? 0 : ii < packed_to ? sam : kc;
          /* the next row block of A (not a long-k block of a narrow product: its rows are long runs, which the
             hardware prefetcher follows) */
          if ({A_AHEAD} && !apk && kc <= {KC_MAX} && ii + {mr} < packed_to)
            for (int i = 0; i < {mr}; i++)
              for (int p = 0; p < kc; p += 16) __builtin_prefetch(at + ({mr} + i) * sam + p, 0, {A_AHEAD});
          for (long jj = j0; jj < jend; jj += {nr}) {{
            int nr = cols - jj < {nr} ? (int)(cols - jj) : {nr};
            const float* panel = bp + (jj - j0) * kc;
            if (images) plait_tile_{t}(kc, at, lda, panel, C, m, n, ii, jj, mr, nr, acc || pc > 0, last, epi, extra, sc);
            else if (ii == i0 && jj < jw)
              plait_micro_pk_{t}(kc, at, lda, b + (long)pc * sbk + jj, sbk, (float*)panel, c + ii * rs + jj * cs, rs, cs, mr, nr, acc || pc > 0, sc ? sc + ii : 0);
{_tail_calls(mr, nv)}            else if (sc) plait_micro_sc_{t}(kc, at, lda, panel, c + ii * rs + jj * cs, rs, cs, mr, nr, acc || pc > 0, sc + ii);
            else plait_micro_{t}(kc, at, lda, panel, c + ii * rs + jj * cs, rs, cs, mr, nr, acc || pc > 0);
          }}
          if (fringe)
            plait_fringe(fr, kc, at, lda, {mr}, fb, ldf, part + (ii - i0) / {mr} * {(mr + 3) // 4 * 4 * 4}, pc == 0, last << acc, c + ii * rs + jf * cs, rs, cs, mr, sc ? sc + ii : 0);
          if (epi && last && !images) {{
            int jn = (int)((j1 < cols ? j1 : cols) - j0);
            if (trans) epi(c, bz, (int)j0, ii, jn, mr, extra); else epi(c, bz, ii, (int)j0, mr, jn, extra);
          }}
        }}
      }}
    }}
  }}
}}
"""


GEMV = """//@shared-begin plait_gemv
/* Partial sums of up to M = 4 rows of A with four weight rows bq[q] (B columns contiguous along k) over kc
   (a multiple of PLAIT_VW) elements from pc: part[i * 4 + q] holds row i, column q as a vector, added to in place. */
static inline __attribute__((always_inline)) void plait_gemv_dot_block(int M, int kc, const float* a, long lda,
                                                                     const float* const* bq, int pc,
                                                                     plait_vf* part) {
  plait_vf acc[4][4];
#pragma GCC unroll 4
  for (int i = 0; i < M; i++)
    for (int q = 0; q < 4; q++) acc[i][q] = part[i * 4 + q];
  const float *b0 = bq[0] + pc, *b1 = bq[1] + pc, *b2 = bq[2] + pc, *b3 = bq[3] + pc;
  for (int p = 0; p < kc; p += PLAIT_VW) {
    plait_vf w0 = *(const plait_vf*)(b0 + p), w1 = *(const plait_vf*)(b1 + p);
    plait_vf w2 = *(const plait_vf*)(b2 + p), w3 = *(const plait_vf*)(b3 + p);
#pragma GCC unroll 4
    for (int i = 0; i < M; i++) {
      plait_vf av = *(const plait_vf*)(a + i * lda + p);
      acc[i][0] += av * w0;
      acc[i][1] += av * w1;
      acc[i][2] += av * w2;
      acc[i][3] += av * w3;
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < M; i++)
    for (int q = 0; q < 4; q++) part[i * 4 + q] = acc[i][q];
}

#define PLAIT_DOT_ROWS(M) plait_gemv_dot_block(M, kc, a + (long)(i0 + r) * lda + pc, lda, bq, pc, part + r * 4)

/* C[i, j] for j in [j0, j1): products of the rows of A (contiguous, length k) with B columns contiguous along k (a
   linear layer's weight rows). Four weight rows stream at once; a k chunk of them stays in L1 while it meets up
   to 16 rows of A (a batch of 16 reads the weights once), the sums kept as vectors until the end. */
static void plait_gemv_dot(int m, int k, const float* a, long lda, const float* b, long sbn, float* c, long ldc,
                           int j0, int j1) {
  enum { KC = 1024 };
  int k16 = k / PLAIT_VW * PLAIT_VW;
  plait_vf part[16 * 4];
  for (int j = j0; j < j1; j += 4) {
    int nj = j1 - j < 4 ? j1 - j : 4;
    const float* bq[4]; /* a partial block repeats its last column rather than read past j1 */
    for (int q = 0; q < 4; q++) bq[q] = b + (long)(j + (q < nj ? q : nj - 1)) * sbn;
    for (int i0 = 0; i0 < m; i0 += 16) {
      int mi = m - i0 < 16 ? m - i0 : 16;
      memset(part, 0, sizeof(plait_vf) * 4 * (size_t)mi);
      for (int pc = 0; pc < k16; pc += KC) {
        int kc = k16 - pc < KC ? k16 - pc : KC;
        for (int r = 0; r < mi; r += 4) {
          switch (mi - r < 4 ? mi - r : 4) {
            case 1: PLAIT_DOT_ROWS(1); break;
            case 2: PLAIT_DOT_ROWS(2); break;
            case 3: PLAIT_DOT_ROWS(3); break;
            default: PLAIT_DOT_ROWS(4); break;
          }
        }
      }
      for (int i = 0; i < mi; i++) {
        const float* ai = a + (long)(i0 + i) * lda;
        for (int q = 0; q < nj; q++) {
          float s = 0.0f;
          for (int l = 0; l < PLAIT_VW; l++) s += part[i * 4 + q][l];
          for (int p = k16; p < k; p++) s += ai[p] * bq[q][p];
          c[(long)(i0 + i) * ldc + j + q] = s;
        }
      }
    }
  }
}

/* Rows i0 .. i0 + M - 1 (M <= 4) of C[:, j0:j1] += A[:, p:p+4] B[p:p+4, j0:j1]: each loaded vector of B's four
   rows feeds M rows of partial sums. */
static inline __attribute__((always_inline)) void plait_gemv_axpy4(int M, const float* a, long lda, long sak,
                                                                 const float* b0, long sbk, long SBN, float* c,
                                                                 long ldc, int j0, int j1) {
  const float *b1 = b0 + sbk, *b2 = b1 + sbk, *b3 = b2 + sbk;
  float s[4][4];
  for (int i = 0; i < M; i++)
    for (int q = 0; q < 4; q++) s[i][q] = a[i * lda + q * sak];
  float* restrict c0 = c;
  float* restrict c1 = c + (M > 1 ? ldc : 0);
  float* restrict c2 = c + (M > 2 ? 2 * ldc : 0);
  float* restrict c3 = c + (M > 3 ? 3 * ldc : 0);
#pragma omp simd
  for (int j = j0; j < j1; j++) {
    long q = (long)j * SBN;
    float w0 = b0[q], w1 = b1[q], w2 = b2[q], w3 = b3[q];
    c0[j] += s[0][0] * w0 + s[0][1] * w1 + s[0][2] * w2 + s[0][3] * w3;
    if (M > 1) c1[j] += s[1][0] * w0 + s[1][1] * w1 + s[1][2] * w2 + s[1][3] * w3;
    if (M > 2) c2[j] += s[2][0] * w0 + s[2][1] * w1 + s[2][2] * w2 + s[2][3] * w3;
    if (M > 3) c3[j] += s[3][0] * w0 + s[3][1] * w1 + s[3][2] * w2 + s[3][3] * w3;
  }
}

#define PLAIT_AXPY_ROWS(M) plait_gemv_axpy4(M, a + i0 * lda + (long)p * sak, lda, sak, b0, sbk, SBN, c + i0 * ldc, ldc, j0, j1)

/* C[:, j0:j1] for B rows contiguous along n (SBN == 1) or strided: every row of B is read once as a long run, its
   products added into every row's partial sums for the column block, which stay in L1; four rows of B at a time. */
static inline __attribute__((always_inline)) void plait_gemv_axpy(int m, int k, const float* a, long lda, long sak,
                                                                const float* b, long sbk, long SBN, float* c,
                                                                long ldc, int j0, int j1) {
  for (int i = 0; i < m; i++) memset(c + i * ldc + j0, 0, sizeof(float) * (size_t)(j1 - j0));
  int p = 0;
  for (; p + 4 <= k; p += 4) {
    const float* b0 = b + (long)p * sbk;
    for (int i0 = 0; i0 < m; i0 += 4) {
      switch (m - i0 < 4 ? m - i0 : 4) {
        case 1: PLAIT_AXPY_ROWS(1); break;
        case 2: PLAIT_AXPY_ROWS(2); break;
        case 3: PLAIT_AXPY_ROWS(3); break;
        default: PLAIT_AXPY_ROWS(4); break;
      }
    }
  }
  for (; p < k; p++) {
    const float* b0 = b + (long)p * sbk;
    for (int i = 0; i < m; i++) {
      float a0 = a[i * lda + (long)p * sak];
      float* restrict ci = c + i * ldc;
#pragma omp simd
      for (int j = j0; j < j1; j++) ci[j] += a0 * b0[(long)j * SBN];
    }
  }
}

/* Few rows (a linear layer at batch 1 to 16): bound by reading B once, so B is streamed in its own layout with no
   packing, each task taking a contiguous range of columns. Dot-product columns (B contiguous along k) split into several
   chunks per thread, each thread taking a contiguous run of them (gemm_c.py: static task schedules); axpy columns
   need long rows to stream, so they split only once per thread. */
static void plait_sgemv(long batch, long inner, int m, int n, int k, const float* A, long sab, long sai, long sam,
                        long sak, const float* B, long sbb, long sbi, long sbk, long sbn, float* C,
                        plait_epi_fn epi, void* const* extra) {
  int threads = omp_get_num_threads(), dot = sbk == 1 && k > 1;
  long want = (dot ? 4L : 1L) * threads, per = batch >= want ? 1 : (want + batch - 1) / batch;
  long most = (n + (dot ? 15 : 255)) / (dot ? 16 : 256); /* column chunks per batch entry */
  if (per > most) per = most;
  if (per < 1) per = 1;
#pragma omp for schedule(static) nowait
  for (long t = 0; t < batch * per; t++) {
    long bz = t / per;
    int j0 = (int)(n * (t % per) / per), j1 = (int)(n * (t % per + 1) / per);
    const float* a = A + bz / inner * sab + bz % inner * sai;
    const float* b = B + bz / inner * sbb + bz % inner * sbi;
    float* c = C + bz * (long)m * n;
    if (dot) {
      long lda = sam;
      if (sak != 1) { /* the dot kernel reads rows of A contiguously */
        float* ap = plait_scratch((size_t)m * k);
        for (int i = 0; i < m; i++)
          for (int p = 0; p < k; p++) ap[(long)i * k + p] = a[i * sam + p * sak];
        a = ap;
        lda = k;
      }
      plait_gemv_dot(m, k, a, lda, b, sbn, c, n, j0, j1);
    } else {
      /* the partial sums of every row for one column block stay in L1 (about 32 KB) */
      int cb = (8192 / m + 15) / 16 * 16;
      if (cb > 2048) cb = 2048;
      for (int c0 = j0; c0 < j1; c0 += cb) {
        int c1 = c0 + cb < j1 ? c0 + cb : j1;
        if (sbn == 1) plait_gemv_axpy(m, k, a, sam, sak, b, sbk, 1, c, n, c0, c1);
        else plait_gemv_axpy(m, k, a, sam, sak, b, sbk, sbn, c, n, c0, c1);
      }
    }
    if (epi) epi(c, bz, 0, j0, m, j1 - j0, extra);
  }
}
//@shared-end
"""


DEPTHWISE = """//@shared-begin plait_dwconv
/* A depthwise convolution (one filter per channel plane); planes are independent tasks, and epi runs on each
   finished plane. */
typedef int plait_dw_vi __attribute__((vector_size(PLAIT_VW * 4)));
enum { PLAIT_DW_NV = @DW_NV@, PLAIT_DW_BLOCK = PLAIT_DW_NV * PLAIT_VW }; /* vectors, outputs of a plait_dw_row block */
/* One block of up to PLAIT_DW_BLOCK outputs of an output row (NV vectors), every tap a contiguous read at its
   precomputed offset `off[tap]`; the sums stay in registers across the taps. */
static inline __attribute__((always_inline)) void plait_dw_row(int NV, const float* base, const int* off, int taps,
                                                             const float* w, int cnt, float* out) {
  plait_vf acc[PLAIT_DW_NV] = {{0}};
  for (int t = 0; t < taps; t++) {
    const float* s = base + off[t];
    float wv = w[t];
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) acc[v] += wv * *(const plait_vf*)(s + PLAIT_VW * v);
  }
  if (cnt == PLAIT_VW * NV) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) *(plait_vf*)(out + PLAIT_VW * v) = acc[v];
  } else {
    float tmp[PLAIT_DW_BLOCK] __attribute__((aligned(64)));
#pragma GCC unroll 16
    for (int v = 0; v < NV; v++) *(plait_vf*)(tmp + PLAIT_VW * v) = acc[v];
    memcpy(out, tmp, sizeof(float) * (size_t)cnt);
  }
}

/* One wide stride-1 plane (the others run across the lanes, plait_dw_lanes): the input is copied into a zero-padded
   plane whose rows have room for whole-vector reads past the last output, so every tap of an output row is one
   contiguous read. */
static void plait_dw_plane(const float* x, const float* w, const plait_win* g, int oh, float* c) {
  int ow = g->ow, taps = g->kh * g->kw;
  long rows = (long)oh + (long)(g->kh - 1) * g->dh; /* padded rows any output reads */
  long need = (long)(g->kw - 1) * g->dw + (ow + PLAIT_VW - 1) / PLAIT_VW * PLAIT_VW, cols = g->w + 2 * g->pw;
  long pitch = ((need > cols ? need : cols) + PLAIT_VW - 1) / PLAIT_VW * PLAIT_VW;
  float* pad = plait_scratch((size_t)(rows * pitch));
  int off[taps];
  for (int ky = 0; ky < g->kh; ky++)
    for (int kx = 0; kx < g->kw; kx++) off[ky * g->kw + kx] = (int)(ky * g->dh * pitch + kx * g->dw);
  for (long y = 0; y < rows; y++) {
    float* d = pad + y * pitch;
    long iy = y - g->ph;
    memset(d, 0, sizeof(float) * (size_t)pitch);
    if (iy >= 0 && iy < g->h) memcpy(d + g->pw, x + iy * g->w, sizeof(float) * (size_t)g->w);
  }
  for (int oy = 0; oy < oh; oy++) {
    const float* base = pad + (long)oy * pitch;
    for (int ox0 = 0; ox0 < ow; ox0 += PLAIT_DW_BLOCK) {
      int cnt = ow - ox0 < PLAIT_DW_BLOCK ? ow - ox0 : PLAIT_DW_BLOCK;
      float* out = c + (long)oy * ow + ox0;
      switch ((cnt + PLAIT_VW - 1) / PLAIT_VW) {
//@dw_row_cases
      }
    }
  }
}

/* One stride-1 plane with narrow rows: the input is copied into a zero-padded plane whose pitch is the padded row
   width, and the outputs are computed at the padded positions q = oy * pitch + ox in runs of PLAIT_DW_BLOCK that
   span rows (a row of 7 or 14 outputs would leave most of a block idle), every tap one contiguous read at
   q + off[tap]; the positions past each row's last output are computed and dropped when the rows are copied out.
   Unlike planes across the vector lanes, no transposes (two per vector of pixels there). */
static void plait_dw_flat(const float* x, const float* w, const plait_win* g, int oh, float* c) {
  int ow = g->ow, taps = g->kh * g->kw, reach = (g->kw - 1) * g->dw + ow, pitch = g->w + 2 * g->pw;
  if (pitch < reach) pitch = reach;
  long rows = (long)oh + (long)(g->kh - 1) * g->dh; /* padded rows any output reads */
  long nq = ((long)(oh - 1) * pitch + ow + PLAIT_DW_BLOCK - 1) / PLAIT_DW_BLOCK * PLAIT_DW_BLOCK; /* whole blocks */
  long size = nq + (long)(g->kh - 1) * g->dh * pitch + (g->kw - 1) * g->dw; /* one past the furthest read */
  if (size < rows * pitch) size = rows * pitch;
  float* pad = plait_scratch((size_t)(size + nq));
  float* out = pad + size;
  int off[taps];
  for (int ky = 0; ky < g->kh; ky++)
    for (int kx = 0; kx < g->kw; kx++) off[ky * g->kw + kx] = ky * g->dh * pitch + kx * g->dw;
  memset(pad, 0, sizeof(float) * (size_t)size);
  int cw = g->w < pitch - g->pw ? g->w : pitch - g->pw; /* input columns any output reads */
  for (long y = 0; y < rows; y++) {
    long iy = y - g->ph;
    if (iy >= 0 && iy < g->h) memcpy(pad + y * pitch + g->pw, x + iy * g->w, sizeof(float) * (size_t)cw);
  }
  for (long q = 0; q < nq; q += PLAIT_DW_BLOCK)
    plait_dw_row(PLAIT_DW_NV, pad + q, off, taps, w, PLAIT_DW_BLOCK, out + q);
  for (int oy = 0; oy < oh; oy++) memcpy(c + (long)oy * ow, out + (long)oy * pitch, sizeof(float) * (size_t)ow);
}

/* Eight outputs of PLAIT_VW planes side by side (one plane per vector lane), each output pixel at offset pix[v] of
   the channel-interleaved padded input, every tap one aligned vector load at off[t]; eight accumulators hide the FMA
   latency over the few taps. */
static inline __attribute__((always_inline)) void plait_dw_lanes8(const float* p, const int* pix, const int* off,
                                                                int taps, const float* wv, float* o) {
  plait_vf acc[8] = {{0}};
  for (int t = 0; t < taps; t++) {
    plait_vf w = *(const plait_vf*)(wv + PLAIT_VW * t);
    const float* s = p + off[t];
#pragma GCC unroll 8
    for (int v = 0; v < 8; v++) acc[v] += w * *(const plait_vf*)(s + pix[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < 8; v++) *(plait_vf*)(o + PLAIT_VW * v) = acc[v];
}

/* A PLAIT_VW x PLAIT_VW block: rows r[0..VW-1] in, columns out (r[q][l] becomes r[l][q]), by shuffles. */
static inline __attribute__((always_inline)) void plait_dw_transpose(plait_vf* r) {
//@transpose
}

/* Rows y0 .. y0 + rn - 1 of the zero-padded input of up to PLAIT_VW planes (xs[l], l < lanes) into d, channel-minor
   (pixel (y, x) of the buffer is the vector d[(y - y0) * cols + x]): vector-long runs of the planes' rows are
   transposed in registers; lanes past `lanes` are zero. */
static void plait_dw_interleave(const float* const* xs, int lanes, const plait_win* g, int y0, int rn, int cols,
                                float* d) {
  int x1 = g->w + g->pw < cols ? g->w : cols - g->pw;
  plait_vf r[PLAIT_VW];
  for (int yb = 0; yb < rn; yb++, d += (long)cols * PLAIT_VW) {
    int iy = y0 + yb - g->ph;
    if (iy < 0 || iy >= g->h) {
      memset(d, 0, sizeof(float) * PLAIT_VW * (size_t)cols);
      continue;
    }
    memset(d, 0, sizeof(float) * PLAIT_VW * (size_t)g->pw);
    memset(d + (long)(g->pw + x1) * PLAIT_VW, 0, sizeof(float) * PLAIT_VW * (size_t)(cols - g->pw - x1));
    long at = (long)iy * g->w;
    for (int x0 = 0; x0 < x1; x0 += PLAIT_VW) {
      int cnt = x1 - x0 < PLAIT_VW ? x1 - x0 : PLAIT_VW;
      int whole = at + x0 + PLAIT_VW <= (long)g->h * g->w; /* the read stays in the plane */
      for (int l = 0; l < PLAIT_VW; l++) {
        const float* s = xs[l] + at + x0;
        if (l < lanes && whole) {
          r[l] = *(const plait_vf*)s; /* columns past cnt are read but never stored */
        } else {
          r[l] = (plait_vf){0};
          if (l < lanes)
            for (int j = 0; j < cnt; j++) r[l][j] = s[j];
        }
      }
      plait_dw_transpose(r);
      for (int q = 0; q < cnt; q++) *(plait_vf*)(d + PLAIT_VW * (g->pw + x0 + q)) = r[q];
    }
  }
}

/* Up to PLAIT_VW planes (`lanes`, from plane bz0) side by side, one per vector lane: a plane-wise kernel leaves most
   of a vector idle on short rows (7 or 14 outputs in mobilenet_v2) and needs a deinterleave for strided taps, while
   across planes every tap of every output pixel is one whole-vector load. Output rows run in strips whose
   channel-minor input (plait_dw_interleave) stays in L1; the outputs are transposed back into the planes at the end. */
enum { PLAIT_DW_PREFETCH = 256 }; /* floats per input plane up to which plait_dw_lanes prefetches the planes */
enum { PLAIT_DW_GROUP = 4096 }; /* outputs per task of plait_dw_masked: small planes run a few to a task */
static void plait_dw_lanes(long bz0, int lanes, long inner, int n, const float* A, long sab, long sai,
                           const float* X, long sxb, long sxi, const plait_win* g, float* C) {
  enum { STRIP_BYTES = 32768 };
  int taps = g->kh * g->kw, ow = g->ow, oh = n / ow, span = (g->kh - 1) * g->dh + 1;
  int cols = (ow - 1) * g->sw + (g->kw - 1) * g->dw + 1;
  int so = (STRIP_BYTES / (cols * PLAIT_VW * 4) - span) / g->sh + 1; /* output rows per strip */
  if (so < 1) so = 1;
  if (so > oh) so = oh;
  int rows = (so - 1) * g->sh + span, nr = (n + PLAIT_VW - 1) / PLAIT_VW * PLAIT_VW;
  float* p = plait_scratch((size_t)((long)rows * cols + nr + taps) * PLAIT_VW);
  float* restrict o = p + (long)rows * cols * PLAIT_VW;
  float* restrict wv = o + (long)nr * PLAIT_VW;
  const float* xs[PLAIT_VW];
  memset(wv, 0, sizeof(float) * PLAIT_VW * (size_t)taps);
  long plane = (long)g->h * g->w;
  for (int l = 0; l < lanes; l++) {
    long bz = bz0 + l;
    const float* w = A + bz / inner * sab + bz % inner * sai;
    xs[l] = X + bz / inner * sxb + bz % inner * sxi;
    for (int t = 0; t < taps; t++) wv[PLAIT_VW * t + l] = w[t];
    /* small planes are read row by row across all lanes at once: their lines requested up front arrive together */
    if (plane <= PLAIT_DW_PREFETCH)
      for (long o = 0; o < plane; o += 16) __builtin_prefetch(xs[l] + o);
  }
  int off[taps], pix[so * ow];
  for (int ky = 0; ky < g->kh; ky++)
    for (int kx = 0; kx < g->kw; kx++) off[ky * g->kw + kx] = (ky * g->dh * cols + kx * g->dw) * PLAIT_VW;
  for (int oy = 0; oy < so; oy++)
    for (int ox = 0; ox < ow; ox++) pix[oy * ow + ox] = (oy * g->sh * cols + ox * g->sw) * PLAIT_VW;
  for (int oy0 = 0; oy0 < oh; oy0 += so) {
    int sn = (oh - oy0 < so ? oh - oy0 : so) * ow, q = 0;
    float* os = o + (long)oy0 * ow * PLAIT_VW;
    plait_dw_interleave(xs, lanes, g, oy0 * g->sh, (sn / ow - 1) * g->sh + span, cols, p);
    for (; q + 8 <= sn; q += 8) plait_dw_lanes8(p, pix + q, off, taps, wv, os + PLAIT_VW * q);
    for (; q < sn; q++) {
      plait_vf acc = {0};
      for (int t = 0; t < taps; t++)
        acc += *(const plait_vf*)(wv + PLAIT_VW * t) * *(const plait_vf*)(p + pix[q] + off[t]);
      *(plait_vf*)(os + PLAIT_VW * q) = acc;
    }
  }
  plait_vf r[PLAIT_VW];
  for (int q0 = 0; q0 < n; q0 += PLAIT_VW) {
    int cnt = n - q0 < PLAIT_VW ? n - q0 : PLAIT_VW;
    for (int v = 0; v < PLAIT_VW; v++) r[v] = *(const plait_vf*)(o + PLAIT_VW * (q0 + v)); /* room for nr pixels */
    plait_dw_transpose(r);
    for (int l = 0; l < lanes; l++) {
      float* c = C + (bz0 + l) * (long)n + q0;
      if (cnt == PLAIT_VW) *(plait_vf*)c = r[l];
      else
        for (int j = 0; j < cnt; j++) c[j] = r[l][j];
    }
  }
}

#if defined(__AVX512F__) && PLAIT_VW == 16 /* 16-bit masks: one per 16-float vector */
#include <immintrin.h>
/* For a stride-1 plane whose output has the input's size (padding keeps it), output position q = oy * w + ox reads
   tap t at input position q + off[t]: the two planes share their row pitch, so each tap of 16 outputs is one
   unaligned load of the input where it lies, masked (mk[t * nvec + v], vector v) to drop the lanes that fall in the
   padding (past a row's ends, above or below the plane) or past the plane. No padded copy and no transposes, the two
   costs of the other kernels on small planes. The masks repeat along the plane with the period of w against 16
   lanes, so they are built per period and clipped only near the plane's two ends. */
static void plait_dw_masks(const plait_win* g, int n, int nvec, int* off, unsigned short* mk) {
  int w = g->w, period = w, a = 16; /* period: w / gcd(w, 16) vectors */
  while (a) { int r = period % a; period = a; a = r; }
  period = w / period;
  if (period > nvec) period = nvec; /* a plane shorter than one period needs no more */
  unsigned short cb[g->kw * period];
  for (int kx = 0; kx < g->kw; kx++) {
    int dx = kx * g->dw - g->pw;
    for (int v = 0, ox = 0; v < period; v++) {
      unsigned bits = 0;
      for (int l = 0; l < 16; l++, ox = ox + 1 == w ? 0 : ox + 1) bits |= (unsigned)(ox + dx >= 0 && ox + dx < w) << l;
      cb[kx * period + v] = (unsigned short)bits;
    }
  }
  for (int ky = 0; ky < g->kh; ky++)
    for (int kx = 0; kx < g->kw; kx++) {
      int t = ky * g->kw + kx, o = (ky * g->dh - g->ph) * w + kx * g->dw - g->pw;
      off[t] = o;
      for (int v = 0, pv = 0; v < nvec; v++, pv = pv + 1 == period ? 0 : pv + 1) {
        unsigned bits = cb[kx * period + pv];
        int lo = 16 * v + o, hi = 16 * v + 16 > n ? n - 16 * v : 16; /* read from lo; outputs up to hi */
        if (lo < 0) bits &= lo <= -16 ? 0u : 0xffffu << -lo;
        if (lo + 16 > n) bits &= n - lo <= 0 ? 0u : (1u << (n - lo)) - 1;
        if (hi < 16) bits &= (1u << hi) - 1;
        mk[t * nvec + v] = (unsigned short)bits;
      }
    }
}

/* NB vectors of outputs of one plane from vector v0 (plait_dw_masks' layout), the sums in registers across taps; the
   last vector of a plane stores only its outputs inside the plane. */
static inline __attribute__((always_inline)) void plait_dw_masked_block(int NB, const float* x, const float* w,
                                                                      int taps, const int* off,
                                                                      const unsigned short* mk, int nvec, int v0,
                                                                      int n, float* c) {
  __m512 acc[8];
#pragma GCC unroll 8
  for (int v = 0; v < NB; v++) acc[v] = _mm512_setzero_ps();
  const unsigned short* m = mk + v0;
  for (int t = 0; t < taps; t++, m += nvec) {
    __m512 wt = _mm512_set1_ps(w[t]);
    const float* s = x + 16 * v0 + off[t];
#pragma GCC unroll 8
    for (int v = 0; v < NB; v++) acc[v] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[v], s + 16 * v), wt, acc[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NB; v++) {
    int q = 16 * (v0 + v);
    if (q + 16 <= n) _mm512_storeu_ps(c + q, acc[v]);
    else _mm512_mask_storeu_ps(c + q, (__mmask16)((1u << (n - q)) - 1), acc[v]);
  }
}

static void plait_dw_masked(const float* x, const float* w, int taps, const int* off, const unsigned short* mk,
                            int nvec, int n, float* c) {
  int v0 = 0;
  for (; v0 + 8 <= nvec; v0 += 8) plait_dw_masked_block(8, x, w, taps, off, mk, nvec, v0, n, c);
  switch (nvec - v0) {
    case 1: plait_dw_masked_block(1, x, w, taps, off, mk, nvec, v0, n, c); break;
    case 2: plait_dw_masked_block(2, x, w, taps, off, mk, nvec, v0, n, c); break;
    case 3: plait_dw_masked_block(3, x, w, taps, off, mk, nvec, v0, n, c); break;
    case 4: plait_dw_masked_block(4, x, w, taps, off, mk, nvec, v0, n, c); break;
    case 5: plait_dw_masked_block(5, x, w, taps, off, mk, nvec, v0, n, c); break;
    case 6: plait_dw_masked_block(6, x, w, taps, off, mk, nvec, v0, n, c); break;
    case 7: plait_dw_masked_block(7, x, w, taps, off, mk, nvec, v0, n, c); break;
    default: break;
  }
}
#endif

/* `lanes` 1: the planes run PLAIT_VW at a time across the vector lanes (plait_dw_lanes); 3: read in place with
   masked loads (plait_dw_masked; without AVX-512 and 16-float vectors, as 2); else one by one, 2 in runs across their
   rows (plait_dw_flat), 0 row by row (plait_dw_plane). */
static void plait_dwconv(long batch, long inner, int n, const float* A, long sab, long sai, const float* X, long sxb,
                         long sxi, const plait_win* g, int lanes, float* C, plait_epi_fn epi, void* const* extra) {
  if (lanes == 1) {
#pragma omp for schedule(static) nowait
    for (long b0 = 0; b0 < batch; b0 += PLAIT_VW) {
      int lanes = batch - b0 < PLAIT_VW ? (int)(batch - b0) : PLAIT_VW;
      plait_dw_lanes(b0, lanes, inner, n, A, sab, sai, X, sxb, sxi, g, C);
      if (epi) epi(C + b0 * (long)n, b0, 0, 0, lanes, n, extra); /* the group's planes are rows of one call */
    }
    return;
  }
#if defined(__AVX512F__) && PLAIT_VW == 16
  if (lanes == 3) {
    int taps = g->kh * g->kw, nvec = (n + 15) / 16;
    int off[taps];
    unsigned short mk[taps * nvec];
    plait_dw_masks(g, n, nvec, off, mk);
    long grp = n >= PLAIT_DW_GROUP ? 1 : PLAIT_DW_GROUP / n; /* planes per task: the epilogue runs on them in L1 */
#pragma omp for schedule(static) nowait
    for (long b0 = 0; b0 < batch; b0 += grp) {
      long b1 = batch - b0 < grp ? batch : b0 + grp;
      for (long bz = b0; bz < b1; bz++)
        plait_dw_masked(X + bz / inner * sxb + bz % inner * sxi, A + bz / inner * sab + bz % inner * sai, taps, off, mk,
                        nvec, n, C + bz * (long)n);
      if (epi) epi(C + b0 * (long)n, b0, 0, 0, (int)(b1 - b0), n, extra);
    }
    return;
  }
#else
  if (lanes == 3) lanes = 2;
#endif
#pragma omp for schedule(dynamic, 4) nowait
  for (long bz = 0; bz < batch; bz++) {
    const float* w = A + bz / inner * sab + bz % inner * sai;
    const float* x = X + bz / inner * sxb + bz % inner * sxi;
    float* c = C + bz * (long)n;
    if (lanes == 2) plait_dw_flat(x, w, g, n / g->ow, c);
    else plait_dw_plane(x, w, g, n / g->ow, c);
    if (epi) epi(c, bz, 0, 0, 1, n, extra);
  }
}
//@shared-end
"""


def shuffle_pair(step: int, lo: list[int], hi: list[int], itype: str, vtype: str = "plait_vf") -> str:
    """C statements making `lo` and `hi` (of the vector type `vtype`), each a two-source shuffle of the rows r[i] and
    r[i + step] by a mask of len(lo) lanes, spelled for clang (__builtin_shufflevector) and for gcc (__builtin_shuffle
    with an `itype` mask vector)."""
    out = []
    for name, mask in (("lo", lo), ("hi", hi)):
        idx = ", ".join(map(str, mask))
        out.append(
            f"#if defined(__clang__)\n      {vtype} {name} = __builtin_shufflevector(r[i], r[i + {step}], {idx});\n"
            f"#else\n      {vtype} {name} = __builtin_shuffle(r[i], r[i + {step}], ({itype}){{{idx}}});\n#endif\n"
        )
    return "".join(out)


def transpose_masks(vw: int, b: int) -> tuple[list[int], list[int]]:
    """The two-source shuffle masks (lo, hi) of the vw x vw transpose's stage that swaps the off-diagonal b x b blocks
    of every 2b x 2b block, taking rows r and r + b (b a power of two): lane c of lo is r's c where bit b of c is
    clear, else r + b's c - b; hi the other way round."""
    lo = [c if not c & b else vw + c - b for c in range(vw)]
    hi = [c + b if not c & b else vw + c for c in range(vw)]
    return lo, hi


def _transpose(vw: int) -> str:
    """The body of plait_dw_transpose for vw x vw blocks: log2(vw) stages, stage B exchanging bit B of the row and
    the column index between the rows i and i + B (one two-source shuffle per row and stage, shuffle_pair)."""
    lines = []
    b = vw // 2
    while b:
        lo, hi = transpose_masks(vw, b)
        shuffles = shuffle_pair(b, lo, hi, "plait_dw_vi", "plait_vf")
        lines.append(
            f"#pragma GCC unroll {vw}\n  for (int i = 0; i < {vw}; i++)\n    if (!(i & {b})) {{\n{shuffles}"
            f"      r[i] = lo;\n      r[i + {b}] = hi;\n    }}\n"
        )
        b //= 2
    return "".join(lines)


# Vectors per block of plait_dw_row: 4 zmm accumulators (64 outputs) with AVX-512, as tuned there; with 16 registers
# 8 accumulators, the FMA latency times two FMA ports, leave room for the weight and a load.
DW_NV = 4 if VW == 16 else 8


def _row_cases(nv: int) -> str:
    """The switch cases of plait_dw_plane: a block of v vectors calls plait_dw_row with the constant v."""
    cases = [f"        case {v}: plait_dw_row({v}, base + ox0, off, taps, w, cnt, out); break;\n" for v in range(1, nv)]
    return "".join(cases) + f"        default: plait_dw_row({nv}, base + ox0, off, taps, w, cnt, out); break;\n"


DEPTHWISE = (
    DEPTHWISE.replace("//@transpose\n", _transpose(VW))
    .replace("//@dw_row_cases\n", _row_cases(DW_NV))
    .replace("@DW_NV@", str(DW_NV))
)


# Stride-1 depthwise layers with rows of this many outputs (from, below) run as plait_dw_flat; other stride-1 output
# planes up to DW_LANES_MAX pixels, or with narrower rows, across the vector lanes. With 8-float vectors (Zen 3,
# bench_depthwise_c.py at batch 1 and 16) flat runs beat the lanes on 7x7 planes (1.2-1.4x) and row by row beats them
# on 56x56 (1.5x): the AVX-512 choices below were measured on a host we cannot reach, so they stay for VW 16.
DW_FLAT_ROWS = (10, 29) if VW == 16 else (7, 29)
DW_LANES_MAX = 4096 if VW == 16 else 0
DW_MODES = {"rows": 0, "lanes": 1, "flat": 2, "masked": 3}  # plait_dwconv's `lanes` argument per kernel


DW_MASKS_MAX = 16384  # taps x output vectors of a plane up to which plait_dw_masked keeps its masks on the stack


def masked_fits(win: Any) -> bool:
    """Whether a stride-1 depthwise layer can read its input in place with masked loads (plait_dw_masked): the
    kernel's AVX-512 masks hold 16 lanes, so only with 16-float vectors; the output plane has the input's size (then
    both share one row pitch) and the plane's masks stay small."""
    same = win.oh == win.h and win.ow == win.w
    return VW == 16 and win.sh == win.sw == 1 and same and win.kh * win.kw * -(-win.oh * win.ow // VW) <= DW_MASKS_MAX


def dw_kernel(win: Any) -> str:
    """Which kernel runs a depthwise convolution on the cpu: "lanes" (VW planes across the vector lanes,
    plait_dw_lanes) for strided layers, which the plane-wise kernels do not handle; for stride 1, "masked" where
    `masked_fits`, else "flat" (64-output runs spanning rows, plait_dw_flat) for rows of 10-28 outputs, "lanes" for
    narrower rows and planes up to 56x56, "rows" (plait_dw_plane) for wider planes. Measured inside whole
    mobilenet_v2 plans at batch 1 and 16, each layer both ways in turn (docs/benchmarks.md): on 14x14 and 28x28
    planes the lanes kernel's two 16x16 transposes per 16 pixels cost more than the flat runs' padded positions
    (1.1-1.5x), on 7x7 planes the per-plane copies and calls cost more than the transposes, and on 56x56 planes lanes
    and flat runs are even at batch 1, lanes ahead at 16. With narrower vectors (DW_FLAT_ROWS, DW_LANES_MAX) 7x7
    planes run flat and 56x56 ones row by row."""
    if win.sh > 1 or win.sw > 1:
        return "lanes"
    if masked_fits(win):
        return "masked"
    if DW_FLAT_ROWS[0] <= win.ow < DW_FLAT_ROWS[1]:
        return "flat"
    return "lanes" if win.ow < DW_FLAT_ROWS[0] or win.oh * win.ow <= DW_LANES_MAX else "rows"


def depthwise_call(spec: Any, a_args: str, b_args: str, epi_fn: str, extra: str) -> str:
    """The statements that run a depthwise convolution (`spec.m == 1`, one kh*kw filter per plane) with the kernel
    `dw_kernel` picks."""
    win = spec.conv
    lanes = DW_MODES[dw_kernel(win)]
    return (
        f"{win_decl(win)}"
        f"  plait_dwconv({spec.batch}, {spec.inner}, {spec.n}, {a_args}, {b_args}, &win, {lanes}, C, {epi_fn}, {extra});\n"
    )


# A convolution over few input channels (an image stem: resnet's 7x7/2 over 3 channels) has a shallow patch matrix
# (k = 147) that the implicit GEMM gathers anew for every panel: a quarter of the stem's time was that gather. The
# direct kernel instead splits a band of input rows once into the stride's column phases (zero padding included), so
# that for every patch element p the 16 output pixels of a vector read 16 consecutive floats at a fixed offset
# koff[p]: the micro-kernel loads its B vectors straight from the band, with no packed panels.
DIRECT_MAX_CIN = 4  # input channels up to which a convolution runs as plait_conv_direct
DIRECT_ROWS = 8  # output rows per band (one task): the band's rows are split once and read by every channel block
# (channels, pixel vectors) of plait_conv_direct's register tile: 24 accumulators of the 32 vector registers with
# AVX-512; 12 of the 16 otherwise, with the tile's DV pixel vectors and its broadcast weight
DIRECT_TILE = (8, 3) if VW == 16 else (4, 3)

# Band splitting shared by the stems' direct forms and the stride-2 lanes kernel (plait/codegen/conv_s2_c.py).
DIRECT_BAND = """//@shared-begin plait_dc_band
/* Input rows of one band, zero-padded and split into the column phases of the stride: element t of phase q of band
   row r of channel ci (at ((ci * R + r) * sw + q) * T + t) is padded column t * sw + q of padded row y0 + r.
   Inlined into every caller, so a kernel whose geometry is a constant gets the split specialised: in a batch-built
   library with several callers gcc kept one generic copy, and resnet50's S2CONV 128x784x1152 took 1.25-1.27 ms at
   one thread in the net's own plan against 1.12-1.15 inlined (its two-thread step 0.69 -> 0.60 ms, the stem's
   0.74 -> 0.72; bench_team_steps.py, docs/benchmarks.md). */
static inline __attribute__((always_inline)) void plait_dc_band(const float* x, const plait_win* g, int cin, int y0, int rows, int R, int T, float* buf) {
  int sw = g->sw;
  for (int ci = 0; ci < cin; ci++)
    for (int r = 0; r < rows; r++) {
      int iy = y0 + r - g->ph;
      const float* xr = x + ((long)ci * g->h + iy) * g->w;
      for (int q = 0; q < sw; q++) {
        float* d = buf + ((long)(ci * R + r) * sw + q) * T;
        if (iy < 0 || iy >= g->h) {
          memset(d, 0, sizeof(float) * (size_t)T);
          continue;
        }
        /* input column t * sw + q - pw lies in [0, w) for t in [lo, hi) */
        int off = q - g->pw, lo = off >= 0 ? 0 : (-off + sw - 1) / sw, hi = g->w - off <= 0 ? 0 : (g->w - off + sw - 1) / sw;
        if (hi > T) hi = T;
        if (lo > hi) lo = hi;
        for (int t = 0; t < lo; t++) d[t] = 0.0f;
        const float* xs = xr + off;
        if (sw == 1) memcpy(d + lo, xs + lo, sizeof(float) * (size_t)(hi - lo));
        else if (sw == 2) /* a constant stride, for a caller whose geometry is not a constant (before the
                             function was inlined everywhere, resnet50's S2CONV 128x784x1152 in the net's library:
                             1.32-1.35 -> 1.25-1.26 ms one thread, its two-thread step 0.73 -> 0.68) */
#pragma omp simd
          for (int t = lo; t < hi; t++) d[t] = xs[2L * t];
        else
#pragma omp simd
          for (int t = lo; t < hi; t++) d[t] = xs[(long)t * sw];
        for (int t = hi; t < T; t++) d[t] = 0.0f;
      }
    }
}

/* Prefetch the input rows that task `next` (bands of br output rows) splits, while this task computes: in a whole
   net the image comes from memory, and each 224-float row is too short a run for the hardware prefetcher. */
static void plait_dc_prefetch(const float* X, long sxb, long sxi, long inner, const plait_win* g, int cin, int oh,
                              int br, long next, long end) {
  if (next >= end) return;
  long bands = (oh + br - 1) / br, bz = next / bands;
  int oy0 = (int)(next % bands) * br, rows = oh - oy0 < br ? oh - oy0 : br;
  int y0 = oy0 * g->sh - g->ph, y1 = y0 + (rows - 1) * g->sh + (g->kh - 1) * g->dh + 1;
  const float* x = X + bz / inner * sxb + bz % inner * sxi;
  for (int ci = 0; ci < cin; ci++)
    for (int iy = y0 > 0 ? y0 : 0; iy < y1 && iy < g->h; iy++)
      for (int u = 0; u < g->w; u += 16) __builtin_prefetch(x + ((long)ci * g->h + iy) * g->w + u);
}

/* koff[p]: where patch element p (channel, tap row, tap column) starts in a band split by plait_dc_band, R rows of
   sw phases of T floats per channel */
static void plait_dc_offsets(const plait_win* g, int k, int R, int T, int* koff) {
  int kk = g->kh * g->kw, sw = g->sw;
  for (int p = 0; p < k; p++) {
    int ci = p / kk, ky = p % kk / g->kw, kx = p % g->kw;
    koff[p] = ((ci * R + ky * g->dh) * sw + kx * g->dw % sw) * T + kx * g->dw / sw;
  }
}

/* Task `task` of `end` (bands of br output rows of one image): splits its band of input rows into buf and prefetches
   the next task's; returns the band's output rows. Both direct forms start their tasks here. */
static inline int plait_dc_task(const float* X, long sxb, long sxi, long inner, const plait_win* g, int cin, int oh,
                                int br, long task, long end, int R, int T, float* buf) {
  long bands = (oh + br - 1) / br, bz = task / bands;
  int oy0 = (int)(task % bands) * br, rows = oh - oy0 < br ? oh - oy0 : br;
  const float* x = X + bz / inner * sxb + bz % inner * sxi;
  plait_dc_band(x, g, cin, oy0 * g->sh, (rows - 1) * g->sh + (g->kh - 1) * g->dh + 1, R, T, buf);
  plait_dc_prefetch(X, sxb, sxi, inner, g, cin, oh, br, task + 1, end);
  return rows;
}
//@shared-end
"""

DIRECT = (
    """//@shared-begin plait_conv_direct
/* DM output channels (w: DM weights per patch element, channel-minor) times DV vectors of PLAIT_VW output pixels,
   vector v reading the band at base[v] + koff[p] for patch element p; the sums go to out[i * DV + v]. */
static inline __attribute__((always_inline)) void plait_dc_micro(int k, const int* restrict koff,
                                                               const float* restrict buf, const int* base,
                                                               const float* restrict w, plait_vf* restrict out) {
  enum { DM = @DM@, DV = @DV@ };
  plait_vf acc[DM][DV];
#pragma GCC unroll 8
  for (int i = 0; i < DM; i++)
#pragma GCC unroll 3
    for (int v = 0; v < DV; v++) acc[i][v] = (plait_vf){0};
  const float* b[DV];
#pragma GCC unroll 3
  for (int v = 0; v < DV; v++) b[v] = buf + base[v];
  for (int p = 0; p < k; p++) {
    int o = koff[p];
    plait_vf x[DV];
#pragma GCC unroll 3
    for (int v = 0; v < DV; v++) x[v] = *(const plait_vf*)(b[v] + o);
    const float* wp = w + p * DM;
#pragma GCC unroll 8
    for (int i = 0; i < DM; i++) {
      float wi = wp[i];
#pragma GCC unroll 3
      for (int v = 0; v < DV; v++) acc[i][v] += x[v] * wi;
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < DM; i++)
#pragma GCC unroll 3
    for (int v = 0; v < DV; v++) out[i * DV + v] = acc[i][v];
}

/* C[bz] (m x n, n = oh * ow) = the convolution of image bz (cin = k / (kh * kw) channels) with A's rows, as tasks of
   DIRECT_ROWS output rows of one image: each task splits its band of input rows once (plait_dc_band), packs the
   weights in blocks of DM channels, and runs every DV vectors of PLAIT_VW output pixels against every channel block.
   epi runs on each finished tile while it is in cache. */
static void plait_conv_direct(long batch, long inner, int m, int n, int k, const float* A, long sab, long sai,
                              long sam, const float* X, long sxb, long sxi, const plait_win* g, float* C,
                              plait_epi_fn epi, void* const* extra) {
  enum { BR = @ROWS@, DM = @DM@, DV = @DV@, L = PLAIT_VW };
  int ow = g->ow, oh = n / ow, vpr = (ow + L - 1) / L, kk = g->kh * g->kw, cin = k / kk, sw = g->sw;
  int R = (BR - 1) * g->sh + (g->kh - 1) * g->dh + 1, T = vpr * L + (g->kw - 1) * g->dw / sw;
  int mb = (m + DM - 1) / DM;
  long bands = (oh + BR - 1) / BR;
  size_t nbuf = ((size_t)cin * R * sw * T + 15) / 16 * 16, nw = (size_t)mb * DM * k;
  /* every thread of the team packs the weights once per call, again only when a task's weights differ (groups):
     packed per task, their transposing copy took 6% of alexnet's stem */
  float* buf = plait_scratch(nbuf + nw + (size_t)k);
  float* w = buf + nbuf;
  int* koff = (int*)(w + nw);
  const float* packed = 0;
  plait_dc_offsets(g, k, R, T, koff);
#pragma omp for schedule(static) nowait
  for (long task = 0; task < batch * bands; task++) {
    long bz = task / bands;
    int oy0 = (int)(task % bands) * BR;
    int rows = plait_dc_task(X, sxb, sxi, inner, g, cin, oh, BR, task, batch * bands, R, T, buf);
    const float* a = A + bz / inner * sab + bz % inner * sai;
    float* c = C + bz * (long)m * n;
    if (a != packed) {
      for (int b = 0; b < mb; b++)
        for (int p = 0; p < k; p++)
          for (int i = 0; i < DM; i++)
            w[((long)b * k + p) * DM + i] = b * DM + i < m ? a[(long)(b * DM + i) * sam + p] : 0.0f;
      packed = a;
    }
    int npos = rows * vpr;
    for (int t0 = 0; t0 < npos; t0 += DV) {
      int base[DV], j0[DV], cnt[DV], nv = npos - t0 < DV ? npos - t0 : DV;
      for (int v = 0; v < DV; v++) {
        int pos = t0 + (v < nv ? v : nv - 1), oy = pos / vpr, ox = pos % vpr * L;
        base[v] = oy * g->sh * sw * T + ox;
        j0[v] = (oy0 + oy) * ow + ox;
        cnt[v] = ow - ox < L ? ow - ox : L;
      }
      for (int b = 0; b < mb; b++) {
        plait_vf out[DM * DV];
        plait_dc_micro(k, koff, buf, base, w + (long)b * k * DM, out);
        int i0 = b * DM, mr = m - i0 < DM ? m - i0 : DM;
        for (int v = 0; v < nv; v++)
          for (int i = 0; i < mr; i++) {
            float* d = c + (long)(i0 + i) * n + j0[v];
            if (cnt[v] == L) *(plait_vf*)d = out[i * DV + v];
            else memcpy(d, &out[i * DV + v], sizeof(float) * (size_t)cnt[v]);
          }
      }
    }
    if (epi) epi(c, bz, 0, oy0 * ow, m, rows * ow, extra); /* the band's outputs (about 230 KB) are still in L2 */
  }
}
//@shared-end
""".replace("@ROWS@", str(DIRECT_ROWS))
    .replace("@DM@", str(DIRECT_TILE[0]))
    .replace("@DV@", str(DIRECT_TILE[1]))
)

# The lanes form of the direct kernel puts output channels across the vector lanes instead of output pixels: each
# patch element loads CV vectors of weights and broadcasts the input of PX consecutive output pixels of one row, so
# no lane idles on a row's last partial vector (alexnet's 55-wide rows left 14% of them idle) and every input value
# feeds CV multiply-adds. Its tile is written to C's NCHW planes transposed (pixel-major in registers).
DIRECT_LANES_MICRO = """//@shared-begin plait_dl_micro_@CV@x@PX@
/* CV vectors of PLAIT_VW output channels (w: CV * PLAIT_VW weights per patch element, channel-minor) times PX
   consecutive output pixels of one row over patch elements p0 .. p1 - 1, pixel j reading the band at
   src[koff[p] + j]; channel vector c of pixel j accumulates at o[c * cs + j * PLAIT_VW] (a row tile of
   PLAIT_VW-channel groups, pixel-major), from zero when p0 is 0. */
static inline __attribute__((always_inline)) void plait_dl_micro_@CV@x@PX@(int p0, int p1, const int* restrict koff,
                                                                     const float* restrict src,
                                                                     const float* restrict w, float* restrict o,
                                                                     long cs) {
  enum { CV = @CV@, PX = @PX@ };
  plait_vf acc[PX][CV];
#pragma GCC unroll 32
  for (int j = 0; j < PX; j++)
#pragma GCC unroll 4
    for (int c = 0; c < CV; c++) acc[j][c] = p0 ? *(const plait_vf*)(o + c * cs + j * PLAIT_VW) : (plait_vf){0};
  for (int p = p0; p < p1; p++) {
    const float* s = src + koff[p];
    /* s as a pointer of its own: the PX broadcasts then read s + j, where GCC otherwise adds each pixel's index
       to koff[p] apart (seven more instructions per patch element; 0.88-1.0x the kernel's time) */
    __asm__("" : "+r"(s));
    const plait_vf* wp = (const plait_vf*)(w + (long)p * CV * PLAIT_VW);
    plait_vf wv[CV];
#pragma GCC unroll 4
    for (int c = 0; c < CV; c++) wv[c] = wp[c];
#pragma GCC unroll 32
    for (int j = 0; j < PX; j++) {
      float xj = s[j];
      if (@WMEM@) { /* the last weight vector read again from L1 for every pixel (an operand of its multiply-add)
                       instead of held: CV * PX accumulators, CV - 1 weights and the broadcast fill the registers */
        const plait_vf* wl = wp + CV - 1;
        __asm__ volatile("" : "+r"(wl));
#pragma GCC unroll 4
        for (int c = 0; c < CV - 1; c++) acc[j][c] += wv[c] * xj;
        acc[j][CV - 1] += *wl * xj;
      } else {
#pragma GCC unroll 4
        for (int c = 0; c < CV; c++) acc[j][c] += wv[c] * xj;
      }
    }
  }
#pragma GCC unroll 32
  for (int j = 0; j < PX; j++)
#pragma GCC unroll 4
    for (int c = 0; c < CV; c++) *(plait_vf*)(o + c * cs + j * PLAIT_VW) = acc[j][c];
}

//@shared-end
"""

# The lanes forms' transposing store (one definition whatever their tiles).
DIRECT_LANES_STORE = """//@shared-begin plait_dl_store
/* C's rows i0 .. i0 + PLAIT_VW - 1 at columns j0 .. j0 + nj - 1 (stride n) = the PLAIT_VW x PLAIT_VW block t
   (PLAIT_VW pixels of PLAIT_VW channels, pixel-major) transposed in registers: log2(PLAIT_VW) rounds of two-source
   shuffles, round s swapping the off-diagonal s x s blocks of every 2s x 2s block. */
static inline void plait_dl_store(const float* restrict t, float* restrict d, long n, int nj) {
  enum { L = PLAIT_VW };
  typedef int plait_iv __attribute__((vector_size(PLAIT_VW * 4)));
  /* round s: lo[j] = bit s of j clear ? j : L + j - s; hi[j] = bit s of j clear ? j + s : L + j */
  static const plait_iv lo[@ROUNDS@] = {@LO@};
  static const plait_iv hi[@ROUNDS@] = {@HI@};
  plait_vf r[L];
#pragma GCC unroll 16
  for (int i = 0; i < L; i++) r[i] = *(const plait_vf*)(t + i * L);
#pragma GCC unroll 4
  for (int q = 0; q < @ROUNDS@; q++) {
    int s = 1 << q;
#pragma GCC unroll 16
    for (int i = 0; i < L; i++)
      if (!(i & s)) {
        plait_vf a = r[i], b = r[i + s];
        r[i] = __builtin_shuffle(a, b, lo[q]);
        r[i + s] = __builtin_shuffle(a, b, hi[q]);
      }
  }
  if (nj == L) {
#pragma GCC unroll 16
    for (int i = 0; i < L; i++) *(plait_vf*)(d + i * n) = r[i];
  } else
    for (int i = 0; i < L; i++)
      for (int j = 0; j < nj; j++) d[i * n + j] = r[i][j];
}
//@shared-end
"""


def _store_masks(half: bool) -> str:
    """The shuffle masks of DIRECT_LANES_STORE's rounds as C initialisers (lo: half False; hi: True)."""
    rounds = []
    for q in range(VW.bit_length() - 1):
        idx = transpose_masks(VW, 1 << q)[int(half)]
        rounds.append("{" + ", ".join(map(str, idx)) + "}")
    return (",\n" + " " * 33).join(rounds)  # one round a line, under the first


DIRECT_LANES_STORE = (
    DIRECT_LANES_STORE.replace("@ROUNDS@", str(VW.bit_length() - 1))
    .replace("@LO@", _store_masks(False))
    .replace("@HI@", _store_masks(True))
)

# The stems' lanes-form driver (after DIRECT_BAND and DIRECT_LANES_MICRO).
DIRECT_LANES = """//@shared-begin plait_conv_dlanes_@CV@x@PX@
/* plait_conv_direct's contract with m a multiple of CV * PLAIT_VW: tasks of DIRECT_ROWS output rows of one image
   split their band of input rows once (plait_dc_band, rows of T >= whole pixel groups); every PX pixels of an output
   row run against every block of CV * PLAIT_VW channels, kc patch elements at a time, into a row tile (TW pixels per
   PLAIT_VW-channel group), which is then written to C's planes transposed PLAIT_VW x PLAIT_VW at a time. */
static void plait_conv_dlanes_@CV@x@PX@(long batch, long inner, int m, int n, int k, const float* A, long sab,
                                      long sai, long sam, const float* X, long sxb, long sxi, const plait_win* g,
                                      float* C, plait_epi_fn epi, void* const* extra) {
  enum { BR = @ROWS@, CV = @CV@, PX = @PX@, L = PLAIT_VW, CW = CV * L };
  int ow = g->ow, oh = n / ow, kk = g->kh * g->kw, cin = k / kk, sw = g->sw, mb = m / CW;
  /* patch elements per pass over a row: each pass's weights (at most @KCB@ bytes) stay in L1 for all its pixels */
  int passes = (int)(((long)k * CW * 4 + @KCB@ - 1) / @KCB@), kc = (k + passes - 1) / passes;
  int TW = ((ow + PX - 1) / PX * PX + L - 1) / L * L;
  int R = (BR - 1) * g->sh + (g->kh - 1) * g->dh + 1, T = TW + (g->kw - 1) * g->dw / sw;
  long bands = (oh + BR - 1) / BR;
  size_t nbuf = ((size_t)cin * R * sw * T + 15) / 16 * 16, nw = (size_t)m * k, nt = (size_t)m * TW;
  float* buf = plait_scratch(nbuf + nw + nt + (size_t)k);
  float* w = buf + nbuf;
  float* tile = w + nw;
  int* koff = (int*)(tile + nt);
  const float* packed = 0;
  plait_dc_offsets(g, k, R, T, koff);
#pragma omp for schedule(static) nowait
  for (long task = 0; task < batch * bands; task++) {
    long bz = task / bands;
    int oy0 = (int)(task % bands) * BR;
    int rows = plait_dc_task(X, sxb, sxi, inner, g, cin, oh, BR, task, batch * bands, R, T, buf);
    const float* a = A + bz / inner * sab + bz % inner * sai;
    float* c = C + bz * (long)m * n;
    if (a != packed) {
      for (int b = 0; b < mb; b++)
        for (int p = 0; p < k; p++)
          for (int i = 0; i < CW; i++) w[((long)b * k + p) * CW + i] = a[(long)(b * CW + i) * sam + p];
      packed = a;
    }
    for (int r = 0; r < rows; r++) {
      const float* src = buf + (long)r * g->sh * sw * T;
      if (r + 1 < rows) /* the next output row's lines of C, for writing, while this row computes */
        for (int i = 0; i < m; i++)
          for (int j = 0; j < ow; j += 16) __builtin_prefetch(c + (long)i * n + (long)(oy0 + r + 1) * ow + j, 1);
      for (int b = 0; b < mb; b++)
        for (int p0 = 0; p0 < k; p0 += kc)
          for (int x0 = 0; x0 < ow; x0 += PX)
            plait_dl_micro_@CV@x@PX@(p0, p0 + kc < k ? p0 + kc : k, koff, src + x0, w + (long)b * k * CW,
                                     tile + ((long)b * CV * TW + x0) * L, (long)TW * L);
      float* d = c + (long)(oy0 + r) * ow;
      for (int cg = 0; cg < m / L; cg++)
        for (int x0 = 0; x0 < ow; x0 += L)
          plait_dl_store(tile + ((long)cg * TW + x0) * L, d + (long)cg * L * n + x0, n, ow - x0 < L ? ow - x0 : L);
    }
    if (epi) epi(c, bz, 0, oy0 * ow, m, rows * ow, extra);
  }
}
//@shared-end
""".replace("@ROWS@", str(DIRECT_ROWS))
# Weight bytes per pass of the lanes form over a row (alexnet's 363 x 64 weights, 93 KB, came from L2 for every
# pixel group; in passes of 24 KB each stays in L1 for the row). With 16-channel panels (below) 24 KB is 384 patch
# elements, whose input lines for a row (32 KB for resnet50's S2CONV) no longer fit in L1 beside them; 6 KB keeps
# AVX-512's 96. Zen 3, one thread, fewest of 30 interleaved: S2CONV 128x784x1152 3.63-3.68 -> 3.13-3.17 ms,
# 256x196x2304 3.72 -> 3.52-3.64 (load average 3-4 on 2 cores).
DIRECT_LANES_KC_BYTES = 24576 if VW == 16 else 6144
# channel vectors and pixel counts of the lanes form's register tile: with AVX-512 4 x 5-7 pixels (20-28
# accumulators of 32 registers); with 16 registers 2 x 5-6 (10-12 accumulators, 2 weight vectors and the broadcast).
# Zen 3, one thread: 2 x 4's 8 accumulators wait on the multiply-add latency (resnet's stem 1.6x 2 x 6's time), and
# 2 x 7 (its last weight from L1), 3 x 4 and 1 x 12 lost to 2 x 5 or 2 x 6 on both S2CONV layers and both stems.
DIRECT_LANES_CV = 4 if VW == 16 else 2
DIRECT_LANES_PX = (5, 6, 7) if VW == 16 else (5, 6)
VECTOR_REGS = 32 if VW == 16 else 16  # vector registers a lanes tile can fill (zmm with AVX-512; ymm, xmm, NEON q)
# A tile whose accumulators, weights and broadcast need more than the vector registers (4 x 7: 28 + 4 + 1) reads
# its last weight vector from L1 at every pixel, where gcc otherwise spilled an accumulator every patch element.
# One thread against controls: resnet50's S2CONV 128x784x1152 1.289-1.300 -> 1.253-1.259 ms, 256x196x2304
# 1.278-1.292 -> 1.254-1.269; its stem unchanged (docs/benchmarks.md, thirteenth session).
DIRECT_LANES_WMEM = True
# Patch elements from which the lanes form runs: with its weight passes and prefetches it took 0.84-0.91 of the
# pixel-vector form's time on alexnet's stem (k 363) and 0.92-0.94 on resnet's (k 147) inside whole replays, one
# thread; on vgg16's 3x3 stem (k 27) its fewest time was 1.7x (docs/benchmarks.md). k in between is not measured.
DIRECT_LANES_MIN_K = 64


def win_decl(win: Any) -> str:
    """The kernel-body statement that declares `win`, the plait_win geometry every window kernel reads (the image's
    size, the window's taps, strides, padding, dilation and the output row's width)."""
    geo = f"{win.h}, {win.w}, {win.kh}, {win.kw}, {win.sh}, {win.sw}, {win.ph}, {win.pw}, {win.dh}, {win.dw}, {win.ow}"
    return f"  static const plait_win win = {{{geo}}};\n"


def use_direct(win: Any, m: int, k: int) -> bool:
    """True when a convolution runs as plait_conv_direct: an image stem (at most DIRECT_MAX_CIN input channels),
    its patch columns laid out per image (not folded for a weight gradient)."""
    return not win.fold and k // (win.kh * win.kw) <= DIRECT_MAX_CIN and m >= 8


def direct_lanes(win: Any, m: int, k: int) -> tuple[int, int] | None:
    """The (channel vectors, pixels) tile of the direct kernel's lanes form for a stem of m output channels, k patch
    elements and window `win` (the pixel count that pads its rows least), or None where the pixel-vector form runs:
    m not a whole number of channel blocks, or fewer than DIRECT_LANES_MIN_K patch elements."""
    if m % (DIRECT_LANES_CV * VW) or k < DIRECT_LANES_MIN_K:
        return None
    return DIRECT_LANES_CV, lanes_pixels(win.ow)


def lanes_pixels(ow: int) -> int:
    """The pixels per register tile (of DIRECT_LANES_PX) that pad an output row of ow pixels least, the most on a tie."""
    return min(DIRECT_LANES_PX, key=lambda p: (-(-ow // p) * p, -p))


def direct_library(win: Any, m: int, k: int) -> str:
    """The shared C code of the direct few-channel convolution for m output channels and k patch elements over
    window `win`."""
    tile = direct_lanes(win, m, k)
    if tile is None:
        return at_o2(COMMON) + at_o2(DIRECT_BAND) + at_o2(DIRECT)
    lanes = DIRECT_LANES.replace("@CV@", str(tile[0])).replace("@PX@", str(tile[1]))
    lanes = lanes.replace("@KCB@", str(DIRECT_LANES_KC_BYTES))
    return at_o2(COMMON) + at_o2(DIRECT_BAND) + at_o2(DIRECT) + lanes_blocks(*tile) + at_o2(lanes)


def lanes_blocks(cv: int, px: int) -> str:
    """The lanes micro-kernel for a cv x px tile and the transposing store (after COMMON and DIRECT_BAND): what a
    direct kernel with output channels across the lanes builds on (the stems' lanes form, conv_s2_c.py)."""
    wmem = int(DIRECT_LANES_WMEM and cv * px + cv + 1 > VECTOR_REGS)
    micro = DIRECT_LANES_MICRO.replace("@CV@", str(cv)).replace("@PX@", str(px)).replace("@WMEM@", str(wmem))
    return at_o2(micro) + at_o2(DIRECT_LANES_STORE)


def direct_call(spec: Any, a_args: str, b_args: str, epi_fn: str, extra: str) -> str:
    """The statements that run a few-channel convolution with plait_conv_direct or its lanes form (A: the weights,
    rows contiguous along k; B: the image)."""
    win = spec.conv
    tile = direct_lanes(win, spec.m, spec.k)
    fn = "plait_conv_direct" if tile is None else f"plait_conv_dlanes_{tile[0]}x{tile[1]}"
    return (
        f"{win_decl(win)}"
        f"  {fn}({spec.batch}, {spec.inner}, {spec.m}, {spec.n}, {spec.k}, {a_args}, {b_args}, &win, C, {epi_fn}, {extra});\n"
    )


def _tail_calls(mr: int, nv: int, add: str = "acc || pc > 0", scaled: bool = True) -> str:
    """Driver branches that run a partial last panel of at most v < nv vectors' columns with the v-vector kernel
    (TAIL_VECTORS), instead of the whole tile computing zero columns. `add`: the C expression saying whether the tile
    adds to C; `scaled`: whether a row scale `sc` may be set (then its branch comes first)."""
    out = ""
    for v in range(1, min(nv, TAIL_VECTORS + 1)):
        t = f"{mr}x{v}of{nv}"
        if scaled:
            out += (
                f"            else if (nr <= {v * VW} && sc) plait_micro_sc_{t}(kc, at, lda, panel, c + ii * rs + jj * cs,"
                f" rs, cs, mr, nr, {add}, sc + ii);\n"
            )
        out += (
            f"            else if (nr <= {v * VW}) plait_micro_{t}(kc, at, lda, panel, c + ii * rs + jj * cs, rs, cs, mr, "
            f"nr, {add});\n"
        )
    return out


def library(mr: int, nv: int) -> str:
    """The shared C code for one register tile (compiled once per translation unit, whatever the shapes)."""
    tails = "".join(_micro(mr, v, nv) for v in range(1, min(nv, TAIL_VECTORS + 1)))
    tile = f"//@shared-begin plait_gemm_{mr}x{nv}\n{_micro(mr, nv)}{tails}{_driver(mr, nv)}//@shared-end\n"
    return at_o2(COMMON) + at_o2(FRINGE) + at_o2(tile)


def gemv_library() -> str:
    """The shared C code of the few-rows product (GEMV)."""
    return at_o2(COMMON) + at_o2(GEMV)


def depthwise_library() -> str:
    """The shared C code of the depthwise convolution."""
    return at_o2(COMMON) + at_o2(DEPTHWISE)


def call(
    fn: str,
    spec: Any,
    a_args: str,
    b_args: str,
    trans: bool,
    epi_fn: str,
    extra: str,
    acc: bool = False,
    sc: str = "0",
    apk: bool = False,
) -> str:
    """The statements of a kernel body that run one GEMM (the window of an implicit-GEMM B operand included); with
    `acc` the product is added to what C holds on entry, its rows scaled by the array `sc` names (when not 0); with
    `apk`, A is the weight packed at plan build (APack)."""
    win = spec.conv
    if win is None:
        return f"  {fn}({spec.batch}, {spec.inner}, {spec.m}, {spec.n}, {spec.k}, {a_args}, {b_args}, 0, C, {int(trans)}, {int(acc)}, {sc}, {epi_fn}, {extra}, {int(apk)});\n"
    return (
        f"{win_decl(win)}"
        f"  {fn}({spec.batch}, {spec.inner}, {spec.m}, {spec.n}, {spec.k}, {a_args}, {b_args}, &win, C, 0, {int(acc)}, {sc}, {epi_fn}, {extra}, {int(apk)});\n"
    )
