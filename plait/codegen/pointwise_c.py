"""The C kernel for products with few rows over long, row-contiguous B: pointwise (1x1) convolutions with few output
channels (mobilenet_v2's 16-64-channel projections, whose B is the image itself, channels x pixels).

The GEMM library packs B into panels before multiplying; with 16-32 rows each packed element feeds only that many
multiply-adds, so the packing copy (K strided rows per panel, one memory stream each) cost twice the multiply-adds
(`perf`: 50% of mobilenet_v2's 24x3136x144 product in memmove). Here B is read where it lies: a block of 16*NV
columns of all K rows meets every row block of the (packed, transposed) weights while it is in L1, and the next
block's lines are prefetched while the first row block runs, so B streams from memory once with no copy. The fused
epilogue runs on each finished block while it is in cache.
"""

from __future__ import annotations

from typing import Any

VW = 16  # floats per vector register (AVX-512)
MAX_ROWS = 32  # products with at most this many rows take this kernel (measured: docs/benchmarks.md)
MIN_COLS = 512  # ... and at least this many columns per product (narrower ones merge images in the GEMM)
L1_BLOCK = 32768  # bytes of one column block of B (K rows x 16*NV columns) kept in L1 across the row blocks
# register tiles (rows, vectors per row), widest first: MR * NV accumulators of 24-28 registers
TILES = ((6, 4), (8, 3), (12, 2), (16, 1))
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
    it multiplies, so it counts a little more)."""
    fit = [t for t in TILES if k * t[1] * VW * 4 <= L1_BLOCK] or [TILES[-1]]

    def split(t: tuple[int, int]) -> tuple[int, int]:
        blocks = -(-m // t[0])
        return -(-m // blocks), t[1]

    def cost(t: tuple[int, int]) -> float:
        mr, nv = split(t)
        return -(-m // mr) * mr * (1.0 + 0.3 * (nv == 1) + 0.1 * (nv == 2))

    return split(min(fit, key=cost))


def _tile(mr: int, nv: int) -> str:
    """C[mr x 16*nv] of one column block: wt holds the row block's weights transposed (k x mr), x the block's K rows
    ldx apart; the sums stay in registers, `rows` of them stored (ldc apart), `cols` columns."""
    nr = nv * VW
    t = f"{mr}x{nv}"
    return f"""static void plait_pw_tile_{t}(int k, const float* restrict wt, const float* restrict x, long ldx,
                                float* restrict c, long ldc, int rows, int cols) {{
  plait_v16 acc[{mr}][{nv}];
#pragma GCC unroll {mr}
  for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) acc[i][v] = (plait_v16){{0}};
  for (int p = 0; p < k; p++) {{
    const float* xp = x + (long)p * ldx;
    plait_v16 b[{nv}];
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) b[v] = *(const plait_v16*)(xp + v * {VW});
    const float* w = wt + p * {mr};
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) acc[i][v] += b[v] * w[i];
  }}
  if (cols == {nr}) {{
    for (int i = 0; i < rows; i++)
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) *(plait_v16*)(c + i * ldc + v * {VW}) = acc[i][v];
  }} else {{
    float tmp[{nr}] __attribute__((aligned(64)));
    for (int i = 0; i < rows; i++) {{
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) *(plait_v16*)(tmp + v * {VW}) = acc[i][v];
      memcpy(c + i * ldc, tmp, sizeof(float) * (size_t)cols);
    }}
  }}
}}
"""


def _driver(mr: int, nv: int) -> str:
    """The product over every batch entry: tasks of (entry, range of column blocks) under one dynamic parallel loop;
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
#pragma omp for schedule(dynamic, 1) nowait
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
