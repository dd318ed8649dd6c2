"""The C kernel of a fused inverted-residual block at inference (mobilenet_v2's expand 1x1 -> depthwise 3x3 -> project
1x1, each with its fused epilogue: batch norm, ReLU6, the residual add).

Run as three kernels, the expanded tensor (six times the block's channels) and the depthwise output go to memory and
come back, and each layer's weights arrive from L3 (docs/benchmarks.md, "where the two-thread replay's extra time
goes"). Here a thread takes a unit of work (a whole image, a strip of an image's output rows, or, for one image on a
7x7 plane, a run of the expanded channels) in chunks of channels whose expanded strips fit in L2: it expands the
chunk over the strip's input rows into a zero-bordered scratch strip (a plane of pixels per vector of channels,
channels across the vector lanes, so the depthwise taps are plain vector loads), runs the depthwise window on it, and
multiplies the chunk into the projection's sums of the strip's rows. A strip expands its border rows twice (4-14%
more expand work on 56x56 to 14x14 planes at two threads); on a 7x7 plane that would be 29-43%, so there the threads
split the channels instead, each projecting into its own partial sums, which they add by output channel after one
barrier. The weights are packed once, at plan build (plait/graph/ops/pointwise_weight.py): the expand's and the
projection's as k-major rows of all output channels, the depthwise weights as tap-major rows. A block without an
expand product (mobilenet_v2's first: the depthwise window straight on the stem's output) runs the same way, its
input channels copied into the bordered strip (transposed 8 x 8 in registers with AVX2) in place of the expand.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from plait.codegen import gemm_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.codegen.expr import ExprBuilder, Idx
from plait.codegen.gemm import Epilogue, _tile_coords
from plait.codegen.gemm_c import VW

# The register tiles: MR pixels (one of MRS, IRBlockPlan.mr; mobilenet_v2's planes are multiples of 7 wide) x NV
# channel vectors. 16-float vectors (32 registers): 7 x 3 accumulators, 3 weight vectors and a broadcast. 8- or
# 4-float vectors (16 registers): 6 x 2 (12 accumulators; the k loop alone 96-98 GFLOP/s on the Zen 3 guest, one
# thread), but 7 x 2 on planes of up to ROWS_PIXELS pixels, where 6 leaves a partial tile of one pixel in 49: though
# one register over (14 accumulators, 2 weight vectors, a broadcast; 81-86 GFLOP/s alone), it took 28% less thread
# CPU than 6 x 2 on mobilenet_v2's 7x7 blocks, and 6 x 2 4-12% less than it on the larger planes (one thread, fewest
# of 7 launches, docs/benchmarks.md).
MRS, NV = ((7,), 3) if VW == 16 else ((6, 7), 2)
assert max(MRS) <= 8  # plait_irb_out transposes a tile 8 pixels at a time
GP = NV * VW  # channels per packed weight panel (the expanded channels must be whole panels)
# input channels per k block of the projection. 256 kept a group's block of weights (48 KB) in L1 on Sapphire Rapids;
# on Zen 5 streaming a group's weights from L2 (3 lines per k against 21 FMAs) is cheaper than storing and adding
# back the partial sums of each block: one block (all of mobilenet_v2's c1 up to 960) measured 4% less thread CPU
# time over the blocks at one thread (docs/benchmarks.md, "mobilenet_v2 on Zen 5").
KC = 1024
L2_CHUNK = 1 << 20  # bytes of one chunk's scratch (bordered expanded plane + depthwise output) kept in L2
# Input planes of more pixels are split among threads by output rows: each thread expands its strip's border rows
# too (4% more expand work on 56x56 planes, 14% on 14x14 ones), but none reads the whole input or writes and adds a
# partial projection of the whole plane, and no thread waits for another. 7x7 planes are split by channels: strips
# of rows would expand 29-43% more, and measured 4% slower (docs/benchmarks.md).
ROWS_PIXELS = 49
# Strips short enough for all of a block's expanded channels to fit L2_CHUNK at once, where that leaves strips of at
# least this many output rows (0: strips as short as one panel of channels needs, the channels in chunks). One
# projection pass then runs over the whole depth into C, where chunks of channels each ran a shallow pass (mobilenet_v2
# b16's 112x112 stride-2 block: six chunks of 16 channels) and added its sums back into the partial output; the
# shorter strips expand a border row (stride 2) or two (stride 1) more per strip. On one image the strips are a whole
# number per thread. mobilenet_v2, two threads, per-round ratios of the large-plane blocks' spans inside whole replays
# (benchmarks/bench_flag_ab.py --steps, both orders): b1 112x112 stride-2 block 0.81 / 0.86, the stem block 0.93 /
# 0.93; b16 0.93 / 0.96, 0.90 / 0.96, 56x56 stride-1 0.94 / 0.91 (docs/benchmarks.md, twenty-first session).
WHOLE_CHUNK_ROWS = 4
# blocks without an expand product (a depthwise window and the projection alone reading it: mobilenet_v2's first
# block) fuse too, the input copied into the scratch (docs/benchmarks.md)
WITHOUT_EXPAND = True
# an image stem (a 3x3 convolution over few channels, mobilenet_v2's) fuses as such a block's expand product
WITH_STEM = True
# The expanded strip's layout: vector-major (each vector of VW channels a plane of the strip's pixels, VW floats a
# pixel), so that a register tile's sums go out as runs of consecutive pixels and the depthwise window reads each
# vector's plane densely; pixel-major (all of a chunk's channels at a pixel, then the next pixel) wrote one cache line
# every cc floats, which the stores paid for. mobilenet_v2, per-round ratios in both build orders: b1 one thread 0.935
# and 0.971 of pixel-major's time, two threads 0.949 and 0.962, b16 0.954 and 0.979; whole b1 replays after 0.2 s
# pauses 0.948 and 0.936 (benchmarks/bench_flag_ab.py; docs/benchmarks.md, twentieth session).
VECTOR_MAJOR = True
# The expand's store loop runs a tile's channel vectors outside and its pixels inside, the epilogue's per-channel
# operands loaded once a vector: mobilenet_v2 b1, one thread, the blocks' CPU time 0.984 and 0.962 of the pixel-outer
# loop's (both build orders), level at two threads (1.011, 1.011) and at batch 16 (0.958, 0.974; docs/benchmarks.md).
STORE_VECTOR_OUTER = True
OUT_AVX2 = True  # the projection's write-back transposes whole tiles in registers with AVX2 (8-float vectors)
# gcc 12 does not know Zen 5 (-march=native tunes for znver3 there), so it may run the kernel's `omp simd` epilogue
# loops on 256-bit vectors; the kernel asks for 512-bit ones (with the loops a vector at a time: 1.7% less thread CPU
# time over mobilenet_v2's blocks at one thread); narrower vectors ask for nothing
WIDE = (
    '#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC target("prefer-vector-width=512")\n#endif\n'
    if VW == 16
    else ""
)


@dataclass(frozen=True)
class IRBlockPlan:
    """One block: `images` images of cin input channels on an h x w plane, c1 expanded channels (whole panels of GP), a
    3x3 depthwise window of stride `stride` (padding 1) to ho x wo, m2 output channels."""

    cin: int
    c1: int
    m2: int
    h: int
    w: int
    stride: int
    images: int = 1
    expand: bool = True  # False: no expand product (mobilenet_v2's first block), c1 == cin, the input copied as is
    # (image channels, height, width, stride) of a 3x3 convolution with padding 1 (an image stem) in place of the
    # expand product, over the image; cin is then its 9 * channels taps
    stem: tuple[int, int, int, int] | None = None

    @property
    def image_floats(self) -> int:
        """Floats of one input image (the stem's image, or cin planes of h x w)."""
        return self.stem[0] * self.stem[1] * self.stem[2] if self.stem else self.cin * self.h * self.w

    @property
    def ho(self) -> int:
        return (self.h - 1) // self.stride + 1

    @property
    def wo(self) -> int:
        return (self.w - 1) // self.stride + 1

    @property
    def mr(self) -> int:
        """Pixels per register tile (MRS): the wider on planes of up to ROWS_PIXELS pixels."""
        return MRS[-1] if self.h * self.w <= ROWS_PIXELS else MRS[0]

    @property
    def m2p(self) -> int:
        """Output channels padded to whole vectors (the packed projection's row length)."""
        return -(-self.m2 // VW) * VW

    @property
    def cache_strips(self) -> int:
        """Fewest strips of output rows an image is cut into so that a strip's scratch (bordered expanded rows and
        depthwise output) fits in L2_CHUNK bytes: for all the expanded channels where such strips keep at least
        WHOLE_CHUNK_ROWS rows (mobilenet_v2: 7 strips of its 112x112 stride-2 block, 4 of its 56x56 stride-1 ones),
        else for one panel of channels, the strip then running its channels in chunks."""
        if WHOLE_CHUNK_ROWS:
            rows = 1
            while rows < self.ho and self._strip_bytes(rows + 1, self.c1) <= L2_CHUNK:
                rows += 1
            if rows >= WHOLE_CHUNK_ROWS or rows == self.ho:
                return -(-self.ho // rows)
        rows = 1
        while rows < self.ho and self._strip_bytes(rows + 1) <= L2_CHUNK:
            rows += 1
        return -(-self.ho // rows)

    def _strip_bytes(self, rows: int, channels: int = GP) -> int:
        """Bytes of the scratch of `channels` channels (default: one panel) for a strip of `rows` output rows."""
        return (((rows - 1) * self.stride + 3) * (self.w + 2) + rows * self.wo) * channels * 4

    @property
    def by_rows(self) -> bool:
        """Whether threads split the block by images and output rows (several images, or planes over ROWS_PIXELS
        pixels), not by channels."""
        return self.images > 1 or self.h * self.w > ROWS_PIXELS


# The operand forms of the register tile: (name, the parameters locating pixel i of row p, that row's start, pixel i
# in it). A 1x1 product reads row p at x + p*sxp, its pixels sxi apart; a stem block's expand reads tap p of a band
# split into the stride's column phases at x + koff[p], its pixels consecutive.
_STRIDED = ("plait_irb_tile", ("long sxp", "long sxi"), "x + p * sxp", "xp[i * sxi]")
_TAPS = ("plait_irb_ktile", ("const int* restrict koff",), "x + koff[p]", "xp[i]")


def _tile(mr: int, nv: int, form: tuple[str, tuple[str, ...], str, str] = _STRIDED) -> str:
    """acc[mr pixels][nv vectors] = sum over k of x[pixel] * w[row]: weight row p at w + p*ldw (nv vectors), pixel i
    of row p where `form` reads it; the sums go to out[i][v] (mr x nv vectors)."""
    name, params, row, pixel = form
    return f"""static inline void {name}{mr}x{nv}(int k, const float* restrict w, long ldw, const float* restrict x,
                                     {", ".join(params)}, float* restrict out) {{
  plait_vf acc[{mr}][{nv}];
#pragma GCC unroll {mr}
  for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) acc[i][v] = (plait_vf){{0}};
  for (int p = 0; p < k; p++) {{
    plait_vf wv[{nv}];
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) wv[v] = *(const plait_vf*)(w + p * ldw + v * {VW});
    const float* xp = {row};
#pragma GCC unroll {mr}
    for (int i = 0; i < {mr}; i++) {{
      float s = {pixel};
#pragma GCC unroll {nv}
      for (int v = 0; v < {nv}; v++) acc[i][v] += wv[v] * s;
    }}
  }}
#pragma GCC unroll {mr}
  for (int i = 0; i < {mr}; i++)
#pragma GCC unroll {nv}
    for (int v = 0; v < {nv}; v++) *(plait_vf*)(out + (i * {nv} + v) * {VW}) = acc[i][v];
}}
"""


def _transpose_stages() -> str:
    """Three two-source shuffles per pair of rows that turn r[0..7] (pixel i's 16 channels in r[i]) into r[j] holding
    channel 2j's 8 pixels in lanes 0-7 and channel 2j+1's in lanes 8-15: stage s exchanges bit s of the row index
    with bit s+1 of the lane index (lane = channel bit 0 + 2 * pixel afterwards); the last stage's masks also put
    each channel's pixels in order."""
    order = [(lane >> 3) + 2 * (lane & 7) for lane in range(16)]  # lane c0*8 + i takes lane c0 + 2i
    out = []
    for s in range(3):
        b = 2 << s
        lo = [lane if not lane & b else 16 + (lane ^ b) for lane in range(16)]
        hi = [lane | b if not lane & b else 16 + lane for lane in range(16)]
        if s == 2:
            lo, hi = [lo[i] for i in order], [hi[i] for i in order]
        shuffles = gemm_c.shuffle_pair(1 << s, lo, hi, "plait_irb_i16")
        out.append(
            f"#pragma GCC unroll 8\n    for (int i = 0; i < 8; i++)\n      if (!(i & {1 << s})) {{\n{shuffles}"
            f"        r[i] = lo;\n        r[i + {1 << s}] = hi;\n      }}\n"
        )
    return "".join(out)


def _avx2_helpers() -> str:
    """plait_irb_t8 (with AVX2 and 8-float vectors: an 8 x 8 block of floats in eight registers transposed in place)
    and plait_irb_rows8 (nr rows, up to 8, of n floats, ld apart, written as n rows of nr floats, ldd apart: the input
    channels of a block without an expand product into its channels-across-lanes scratch)."""
    return """#if defined(__AVX2__) && PLAIT_VW == 8
static inline void plait_irb_t8(__m256 r[8]) {
  __m256 t[8], s[8];
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) { /* s[i + q]: elements q and q + 4 of rows i..i+3 */
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; j++) r[j] = _mm256_permute2f128_ps(s[j & 3], s[4 + (j & 3)], j < 4 ? 0x20 : 0x31);
}
#endif
static inline void plait_irb_rows8(const float* src, long ld, int nr, int n, float* dst, long ldd) {
  int x = 0;
#if defined(__AVX2__) && PLAIT_VW == 8
  for (; nr == 8 && x + 8 <= n; x += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * ld + x);
    plait_irb_t8(r);
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) _mm256_storeu_ps(dst + (long)(x + j) * ldd, r[j]);
  }
#endif
  for (; x < n; x++)
    for (int i = 0; i < nr; i++) dst[(long)x * ldd + i] = src[i * ld + x];
}
"""


def _write_back() -> str:
    """plait_irb_out: a projection tile's sums (MR pixels x nv vectors, pixel-major as plait_irb_tile stores them)
    stored, or added, by channel into rows of C (channel ch's px pixels at dst + ch * ld). Scalar, each channel's
    pixels are MR reads a tile row apart (7% of the blocks' time at one thread); with AVX-512 the tile is transposed
    16 channels at a time in registers and each channel's pixels go out as one masked vector, with AVX2 a whole
    tile's 8 channels at a time and each channel's pixels as 4 + 2 (+ 1) floats (partial tiles stay scalar)."""
    return f"""{_avx2_helpers()}static inline void plait_irb_out(int nv, int rows, int px, int add, const float* tile, float* dst, long ld) {{
#if defined(__AVX512F__) && PLAIT_VW == 16
  const __mmask16 m = (__mmask16)((1u << px) - 1);
  for (int v = 0; v < nv; v++) {{
    plait_vf r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r[i] = i < {max(MRS)} ? *(const plait_vf*)(tile + (i * nv + v) * {VW}) : (plait_vf){{0}};
{_transpose_stages()}    for (int j = 0; j < 8; j++) {{
      int ch = v * {VW} + 2 * j;
      float* d0 = dst + (long)ch * ld;
      for (int hf = 0; hf < 2 && ch + hf < rows; hf++) {{
        float* p = d0 + hf * ld - hf * 8; /* lanes 8-15 (channel ch + 1) land at its row from lane 8 */
        __mmask16 mh = (__mmask16)(m << (8 * hf));
        __m512 val = (__m512)r[j];
        if (add) val = _mm512_add_ps(val, _mm512_maskz_loadu_ps(mh, p));
        _mm512_mask_storeu_ps(p, mh, val);
      }}
    }}
  }}
#else
#if defined(__AVX2__) && PLAIT_VW == 8
  if ({int(OUT_AVX2)} && px >= 6) {{ /* a whole tile (6 or 7 pixels): 8 channels at a time transposed in
                                        registers, each channel's pixels out as 4 + 2 (+ 1) floats */
    for (int v = 0; v < nv; v++) {{
      __m256 r[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) r[i] = i < px ? _mm256_loadu_ps(tile + (i * nv + v) * 8) : _mm256_setzero_ps();
      plait_irb_t8(r);
#pragma GCC unroll 8
      for (int j = 0; j < 8; j++) {{
        int ch = v * 8 + j;
        if (ch >= rows) break;
        float* p = dst + (long)ch * ld;
        __m128 lo = _mm256_castps256_ps128(r[j]), hi = _mm256_extractf128_ps(r[j], 1);
        if (add) {{
          lo = _mm_add_ps(lo, _mm_loadu_ps(p));
          hi = _mm_add_ps(hi, px == 7 ? _mm_setr_ps(p[4], p[5], p[6], 0.0f) : _mm_loadl_pi(_mm_setzero_ps(), (const __m64*)(p + 4)));
        }}
        _mm_storeu_ps(p, lo);
        _mm_storel_pi((__m64*)(p + 4), hi);
        if (px == 7) _mm_store_ss(p + 6, _mm_movehl_ps(hi, hi));
      }}
    }}
    return;
  }}
#endif
  for (int ch = 0; ch < rows; ch++) {{
    float* d = dst + (long)ch * ld;
    if (add)
      for (int i = 0; i < px; i++) d[i] += tile[i * nv * {VW} + ch];
    else
      for (int i = 0; i < px; i++) d[i] = tile[i * nv * {VW} + ch];
  }}
#endif
}}
"""


def _stem_tiles(mr: int) -> str:
    """plait_irb_ktile<mr>: the register tile of a stem block's expand, tap p of pixel i read at x + koff[p] + i (a
    band split into the stride's column phases, gemm_c.DIRECT_BAND), one to NV channel vectors."""
    return "".join(_tile(mr, nv, _TAPS) for nv in range(1, NV + 1)) + _dispatch(mr, _TAPS)


def _dispatch(mr: int, form: tuple[str, tuple[str, ...], str, str] = _STRIDED) -> str:
    """<form's name><mr>: the tile of mr pixels and nv (one to NV) channel vectors."""
    name, params = form[0], form[1]
    args = ", ".join(p.split()[-1] for p in params)
    calls = "".join(f"if (nv == {nv}) {name}{mr}x{nv}(k, w, ldw, x, {args}, out);\n  else " for nv in range(NV, 1, -1))
    decl = ", ".join(p.replace(" restrict", "") for p in params)
    return f"""static inline void {name}{mr}(int nv, int k, const float* w, long ldw, const float* x, {decl},
                                   float* out) {{
  {calls}{name}{mr}x1(k, w, ldw, x, {args}, out);
}}
"""


def library() -> str:
    """The shared register tiles (each of MRS pixels, one to NV channel vectors), their dispatch by width and the projection's
    transposing write-back."""
    tiles = "".join(_tile(mr, nv) for mr in MRS for nv in range(1, NV + 1))
    dispatch = "".join(_dispatch(mr) for mr in MRS)
    # the buffer of the threads' partial sums and scratch planes: the team run's (the same memory for every block of a
    # replay, so it is still in the cores' caches), or one thread's handed to the others when run alone
    prefetch = """static inline void plait_irb_prefetch(const float* w, long l0, long l1) {
  for (long l = l0; l < l1; l++) __builtin_prefetch(w + l * 16, 0, 2);
}
"""
    parts = """static float* plait_irb_parts(size_t n) {
  float* parts = plait_team_shared(n);
  if (!parts) {
#pragma omp single copyprivate(parts)
    parts = plait_shared_scratch(n);
  }
  return parts;
}
"""
    head = (
        "#if defined(__AVX512F__) && PLAIT_VW == 16\n#include <immintrin.h>\n"
        "typedef int plait_irb_i16 __attribute__((vector_size(64)));\n"
        "#elif defined(__AVX2__) && PLAIT_VW == 8\n#include <immintrin.h>\n#endif\n"
    )
    body = f"//@shared-begin plait_irblock\n{head}{tiles}{dispatch}{_write_back()}{prefetch}{parts}//@shared-end\n"
    return gemm_c.at_o2(gemm_c.COMMON) + gemm_c.at_o2(body)


def _epilogue(
    r: Any, epi: Epilogue | None, prefix: str, images: int, channels: int, pixels: int, ch: str, px: str
) -> tuple[str, str, list[str]]:
    """(statements, result, parameter declarations) applying `epi` to `v`, the value of output (image `bz`, channel
    `ch`, pixel `px`) of an (images, channels, pixels) product; its extra buffers are parameters named prefix0,
    prefix1, ..."""
    if epi is None:
        return "", "v", []
    args = {n.uid: f"{prefix}{i}" for i, n in enumerate(epi.extra)}
    b = ExprBuilder(r, args, "int", subst={epi.mm.uid: "v"})
    coords = _tile_coords(epi.root.shape, images, channels, pixels, ch, px)
    linear = f"((long)bz * {channels} + {ch}) * {pixels} + {px}"
    where = Idx(epi.root.shape, coords=coords) if coords else Idx(epi.root.shape, linear=linear)
    res = b.value(epi.root, where)
    params = [r.param(n.dtype, f"{prefix}{i}", False) for i, n in enumerate(epi.extra)]
    return "".join(f"      {ln}\n" for ln in b.lines), res, params


def _store_expanded(p: IRBlockPlan, s1: str, r1: str) -> str:
    """A tile's sums (px pixels from q0, nv vectors) through the expand's epilogue into the bordered strip."""
    wp = p.w + 2
    if STORE_VECTOR_OUTER:
        return f"""          {{ /* the tile's pixels' offsets in a vector's plane (a row's end skips the two border columns) */
            long po[{p.mr}];
            int qy = q0 / w, qx = q0 - qy * w;
            for (int i = 0; i < px; i++, qx++) {{
              if (qx == w) qx = 0, qy++;
              po[i] = ((long)(qy - ya) * {wp} + qx + 1) * epx;
            }}
            /* a vector at a time over the tile's pixels, its epilogue operands loaded once */
            for (int jv = g * {VW}; jv < (g + nv) * {VW}; jv += {VW}) {{
              float* dv = e + (long)(jv / {VW}) * evs;
              const float* src = tile + (jv / {VW} - g) * {VW};
              for (int i = 0; i < px; i++)
#pragma omp simd
                for (int j = jv; j < jv + {VW}; j++) {{
                  int q = q0 + i;
                  float v = src[i * nv * {VW} + j - jv];
{s1}                  dv[po[i] + j - jv] = {r1};
                }}
            }}
          }}
"""
    return f"""          for (int i = 0; i < px; i++) {{
            int q = q0 + i;
            int qy = q / w;
            float* dst = e + ((long)(qy - ya) * {wp} + q - qy * w + 1) * epx + g * evs;
            const float* src = tile + i * nv * {VW};
            /* a vector at a time: the loop over nv * VW channels had a run-time count (and tails) */
            for (int jv = g * {VW}; jv < (g + nv) * {VW}; jv += {VW}) {{
              float* dv = dst + (long)(jv / {VW} - g) * evs;
#pragma omp simd
              for (int j = jv; j < jv + {VW}; j++) {{
                float v = src[j - g * {VW}];
{s1}                dv[j - jv] = {r1};
              }}
            }}
          }}
"""


def _expand_stem(p: IRBlockPlan, s1: str, r1: str) -> str:
    """A stem block's expand: the strip's rows of the stem convolution, a chunk's channels, from the band of image
    rows split once per strip (at its first chunk), a row's tiles of mr pixels at a time."""
    assert p.stem is not None
    st, mr = p.stem[3], p.mr
    return f"""      /* expand: the stem convolution's output rows of the strip, up to {NV} channel vectors of one packed panel at
         a time, from the strip's band of image rows (split into the stride's column phases once, at its first
         chunk), tiles of {mr} pixels within a row (a row's last tile computes past its end, stores only its own) */
      if (cv == v0) plait_dc_band(Xb, &sg, {p.stem[0]}, qa / w * {st}, (qb / w - qa / w - 1) * {st} + 3, band_rows, {_band_t(p)}, band);
      for (int g = 0, nv; g < nvc; g += nv) {{
        int off = (cv + g) % {NV};
        nv = {NV} - off < nvc - g ? {NV} - off : nvc - g;
        const float* w1 = U1 + (long)((cv + g) / {NV}) * cin * {GP} + off * {VW};
        for (int y = qa / w; y < qb / w; y++)
          for (int ox0 = 0; ox0 < w; ox0 += {mr}) {{
            int px = w - ox0 < {mr} ? w - ox0 : {mr}, q0 = y * w + ox0;
            plait_irb_ktile{mr}(nv, cin, w1, {GP}, band + (long)(y - qa / w) * {st * st * _band_t(p)} + ox0, koff, tile);
{_store_expanded(p, s1, r1)}          }}
      }}
"""


def _band_t(p: IRBlockPlan) -> int:
    """Floats per column phase of a band row: the output row's pixels plus the taps' reach past it."""
    assert p.stem is not None
    return p.w + 2 // p.stem[3]


def _expand(p: IRBlockPlan, s1: str, r1: str) -> str:
    """The expand product of a chunk's channels over the strip's input rows into the bordered strip, through the
    expand's epilogue (statements s1, result r1)."""
    if p.stem is not None:
        return _expand_stem(p, s1, r1)
    hw, mr, lines = p.h * p.w, p.mr, -(-GP // 16)
    return f"""      /* expand: up to {NV} channel vectors of one packed panel (their weights stay in L1, the next panel's are
         prefetched into L2 meanwhile, a share per pixel tile) over every tile of {mr} pixels, each tile's sums
         through the expand's epilogue into the bordered strip; a thread's run of vectors may start and end inside a
         panel, so that two threads split 144 channels 64:80, not 48:96 */
      int tiles = (qb - qa + {mr - 1}) / {mr};
      long step = (cin * {lines} + tiles - 1) / (tiles > 0 ? tiles : 1); /* the next panel's lines per tile */
      plait_irb_prefetch(U1 + (long)(cv / {NV}) * cin * {GP}, 0, cin * {lines});
      for (int g = 0, nv; g < nvc; g += nv) {{
        int off = (cv + g) % {NV};
        nv = {NV} - off < nvc - g ? {NV} - off : nvc - g;
        const float* w1 = U1 + (long)((cv + g) / {NV}) * cin * {GP} + off * {VW};
        for (int q0 = qa, l0 = 0; q0 < qb; q0 += {mr}, l0 += step) {{
          if (g + nv < nvc) plait_irb_prefetch(w1 - off * {VW} + (long)cin * {GP}, l0, l0 + step < cin * {lines} ? l0 + step : cin * {lines});
          int px = qb - q0 < {mr} ? qb - q0 : {mr};
          const float* xs = Xb + q0;
          long sxp = {hw};
          if (px < {mr}) {{ /* a partial tile: its pixels copied, zero-padded */
            for (int c = 0; c < cin; c++)
              for (int i = 0; i < {mr}; i++) xt[c * {mr} + i] = i < px ? Xb[(long)c * {hw} + q0 + i] : 0.0f;
            xs = xt;
            sxp = {mr};
          }}
          plait_irb_tile{mr}(nv, cin, w1, {GP}, xs, sxp, 1, tile);
{_store_expanded(p, s1, r1)}        }}
      }}
"""


def _copy_in(p: IRBlockPlan) -> str:
    """A block without an expand product: the chunk's input channels of the strip's rows copied into the bordered
    strip, 8 channels by 8 pixels at a time (transposed in registers with AVX2)."""
    cs = min(8, VW) if VECTOR_MAJOR else 8  # channels a call copies: 8 rows lie in one plane of 8+ lanes
    return f"""      /* no expand product: the chunk's channels of the strip's input rows, as they are */
      for (int y = qa / w; y < qb / w; y++)
        for (int c = 0; c < cc; c += {cs}) /* up to 8 channels at a time, within one vector's plane */
          plait_irb_rows8(Xb + (long)(c0 + c) * {p.h * p.w} + (long)y * w, {p.h * p.w}, cc - c < {cs} ? cc - c : {cs}, w,
                          e + ((long)(y - ya) * {p.w + 2} + 1) * epx + (c / {VW}) * evs + c % {VW}, epx);
"""


def render(
    p: IRBlockPlan, r: Any, epilogues: tuple[Epilogue | None, Epilogue | None, Epilogue | None]
) -> RenderedKernel:
    """The kernel C = block(X) with U1 (cin x c1), UD (9 x c1) and U2 (c1 x m2p) packed at plan build; its
    parameters are C, X, U1 (only with an expand product), UD, U2, then each stage's epilogue buffers (x*, d*, y* in
    stage order)."""
    hw, howo, wp, mr = p.h * p.w, p.ho * p.wo, p.w + 2, p.mr
    s1, r1, prm1 = _epilogue(r, epilogues[0], "x", p.images, p.c1, hw, "c0 + j", "q")
    s2, r2, prm2 = _epilogue(r, epilogues[1], "d", p.images, p.c1, howo, "c0 + j", "o")
    s3, r3, prm3 = _epilogue(r, epilogues[2], "y", p.images, p.m2, howo, "ch", "j")
    lines = -(-GP // 16)  # 64-byte lines (16 floats) of one packed panel's row
    expand = _expand(p, s1, r1) if p.expand else _copy_in(p)
    stem_setup, band = "  long bandn = 0;\n", ""
    if p.stem is not None:  # the band of image rows a strip's stem rows read, split into the stride's phases
        ci, ih, iw, st = p.stem
        stem_setup = f"""  /* the stem's window over the image, its band of image rows for a strip of eh stem rows, the taps' offsets */
  const plait_win sg = {{{ih}, {iw}, 3, 3, {st}, {st}, 1, 1, 1, 1, w}};
  int band_rows = (eh - 1) * {st} + 3, koff[{p.cin}];
  long bandn = (long){ci} * band_rows * {st} * {_band_t(p)} + {2 * p.mr + 16};
  plait_dc_offsets(&sg, {p.cin}, band_rows, {_band_t(p)}, koff);
"""
        band = "      float* band = parts + t * own + scratch - bandn; /* the split image rows, the same for every chunk */\n"
    body = f"""  const int cin = {p.cin}, c1 = {p.c1}, m2 = {p.m2}, m2p = {p.m2p}, h = {p.h}, w = {p.w}, ho = {p.ho}, wo = {p.wo};
  int threads = omp_get_num_threads(), vectors = c1 / {VW}, images = {p.images};
  /* several images, or wide planes, split by images and strips of output rows (each thread all channels, a strip's
     border rows expanded twice, no partial sums): an image in `strips` strips, fewer threads than images taking
     whole images; one image on a small plane split by channels */
  int by_rows = {int(p.by_rows)} || threads == 1;
  int strips = by_rows && threads > images ? (threads + images - 1) / images : 1;
  if (by_rows && strips < {p.cache_strips}) {{ /* strips whose scratch stays in L2, a whole number per thread */
    strips = {p.cache_strips};
    if (images == 1) strips = (strips + threads - 1) / threads * threads;
  }}
  int strip = (ho + strips - 1) / strips, eh = (strip - 1) * {p.stride} + 3;
  /* channel vectors per chunk: the chunk's bordered strip and depthwise output fit in L2_CHUNK bytes */
  long per_vector = ((long)eh * {wp} + (long)strip * wo) * {VW};
  int chunkv = (int)({L2_CHUNK // 4} / per_vector / {NV} * {NV});
  if (chunkv < {NV}) chunkv = {NV};
  int cmax = c1 < chunkv * {VW} ? c1 : chunkv * {VW};
  /* per thread: its scratch (bordered expanded strip, depthwise output, a partial tile's pixels, a tile's sums),
     then, when the channels are split, its partial projection (m2 x ho*wo); otherwise it projects straight into C */
{stem_setup}  long scratch = ((per_vector / {VW}) * cmax + {mr} * (cin > cmax ? cin : cmax) + {mr * NV * VW} + bandn + {VW - 1}) / {VW} * {VW};
  int partial = threads > 1 && !by_rows;
  long own = scratch + (long)partial * m2 * {howo};
  float* parts = plait_irb_parts((size_t)(threads * own));
  /* by rows: units of (image, strip) in static shares with stealing, each thread in its own scratch; by channels:
     thread t's run of channel vectors, its partial sums at t */
  int me = omp_get_thread_num();
  {gemm_c.steal_loop("task", "by_rows ? (long)images * strips : (long)threads", "st", "by_rows")} {{
   int t = by_rows ? me : (int)task;
   {{ /* one unit: image bz, strip su (by channels: the whole image) */
    int u = by_rows ? (int)task : 0, bz = u / strips, su = u % strips;
    const float* Xb = X + (long)bz * {p.image_floats};
    float* part = partial ? parts + t * own + scratch : C + (long)bz * m2 * {howo};
    int v0 = by_rows ? 0 : vectors * t / threads, v1 = by_rows ? vectors : vectors * (t + 1) / threads;
    int oy0 = ho * su / strips, oy1 = ho * (su + 1) / strips;
    if (v0 == v1) memset(part, 0, sizeof(float) * (size_t)m2 * {howo});
    /* the strip's bordered rows ya..yb of the expanded plane (row -1 and row h are the zero border), its pixels
       qa..qb of the input, its npx output pixels from obase */
    int ya = oy0 * {p.stride} - 1, yb = (oy1 - 1) * {p.stride} + 1, npx = (oy1 - oy0) * wo;
    int qa = (ya < 0 ? 0 : ya) * w, qb = (yb < h ? yb + 1 : h) * w;
    long obase = (long)oy0 * wo;
    for (int cv = v0; cv < v1 && oy0 < oy1; cv += chunkv) {{
      int nvc = v1 - cv < chunkv ? v1 - cv : chunkv, cc = nvc * {VW}, c0 = cv * {VW};
      float* e = parts + t * own;
      float* d = e + (long)(yb - ya + 1) * {wp} * cc;
      /* vector v of the strip's pixel p at e + p * epx + v * evs (VECTOR_MAJOR: a plane per vector) */
      long epx = {VW if VECTOR_MAJOR else "cc"}, evs = {f"(long)(yb - ya + 1) * (w + 2) * {VW}" if VECTOR_MAJOR else VW};
      float* xt = d + (long)npx * cc;
      float* tile = xt + {mr} * (cin > cmax ? cin : cmax);
{band}      /* the zero border of the expanded strip (the depthwise window's padding) */
      for (int v = 0; v < nvc; v++) {{
        float* ev = e + v * evs;
        for (int x = 0; x < {wp}; x++) {{
          if (ya < 0) memset(ev + x * epx, 0, sizeof(float) * {VW});
          if (yb >= h) memset(ev + ((long)(yb - ya) * {wp} + x) * epx, 0, sizeof(float) * {VW});
        }}
        for (int y = 0; y <= yb - ya; y++) {{
          memset(ev + (long)y * {wp} * epx, 0, sizeof(float) * {VW});
          memset(ev + ((long)y * {wp} + w + 1) * epx, 0, sizeof(float) * {VW});
        }}
      }}
{expand}      /* depthwise 3x3 over the bordered strip, a vector of channels at a time down all its rows (a row's three
         input rows, 3 x {wp} pixels of one vector, stay in L1 for the next output row), each output vector through
         the epilogue at once; meanwhile this chunk's rows of the projection's panels are prefetched into L2, a share
         per output row of the first vector */
      for (int vc = 0; vc < nvc; vc++) {{
        plait_vf k9[9];
        for (int tp = 0; tp < 9; tp++) k9[tp] = *(const plait_vf*)(UD + (long)tp * c1 + c0 + vc * {VW});
        for (int oy = oy0; oy < oy1; oy++) {{
          if (vc == 0)
            for (int pn = 0; pn < {-(-p.m2 // GP)}; pn++) {{
              long n2 = (long)cc * {lines}, sh = (n2 + oy1 - oy0 - 1) / (oy1 - oy0), l0 = (oy - oy0) * sh;
              plait_irb_prefetch(U2 + ((long)pn * c1 + c0) * {GP}, l0, l0 + sh < n2 ? l0 + sh : n2);
            }}
          const float* row = e + (long)(oy - oy0) * {p.stride} * {wp} * epx + vc * evs;
          for (int ox = 0; ox < wo; ox++) {{
            const float* t0 = row + (long)ox * {p.stride} * epx;
            plait_vf a3[3];
#pragma GCC unroll 3
            for (int dy = 0; dy < 3; dy++) {{ /* a sum per window row: chains of three FMAs, not one of nine */
              const float* t = t0 + (long)dy * {wp} * epx;
              a3[dy] = *(const plait_vf*)t * k9[dy * 3];
#pragma GCC unroll 2
              for (int dx = 1; dx < 3; dx++) a3[dy] += *(const plait_vf*)(t + (long)dx * epx) * k9[dy * 3 + dx];
            }}
            plait_vf acc = a3[0] + a3[1] + a3[2];
            int o = oy * wo + ox;
            float* dp = d + (long)(o - obase) * cc;
            *(plait_vf*)(dp + vc * {VW}) = acc;
#pragma omp simd
            for (int j = vc * {VW}; j < (vc + 1) * {VW}; j++) {{
              float v = dp[j];
{s2}              dp[j] = {r2};
            }}
          }}
        }}
      }}
      /* project: this chunk's channels into the partial sums (or the strip's rows of C), a group of up to {NV}
         output vectors over k blocks of up to {KC} channels (the group's block of weights stays in L1) over every
         tile of {mr} pixels */
      for (int g = 0; g < m2p / {VW}; g += {NV}) {{
        int nv = m2p / {VW} - g < {NV} ? m2p / {VW} - g : {NV};
        const float* w2 = U2 + (long)(g / {NV}) * c1 * {GP};
        int rows = m2 - g * {VW} < nv * {VW} ? m2 - g * {VW} : nv * {VW};
        for (int k0 = 0; k0 < cc; k0 += {KC}) {{
          int kc = cc - k0 < {KC} ? cc - k0 : {KC}, add = cv > v0 || k0 > 0;
          for (int q0 = 0; q0 < npx; q0 += {mr}) {{
            int px = npx - q0 < {mr} ? npx - q0 : {mr};
            const float* ds = d + (long)q0 * cc + k0;
            long sxp = 1, sxi = cc;
            if (px < {mr}) {{
              for (int c = 0; c < kc; c++)
                for (int i = 0; i < {mr}; i++) xt[c * {mr} + i] = i < px ? ds[(long)i * cc + c] : 0.0f;
              ds = xt;
              sxp = {mr};
              sxi = 1;
            }}
            plait_irb_tile{mr}(nv, kc, w2 + (long)(c0 + k0) * {GP}, {GP}, ds, sxp, sxi, tile);
            plait_irb_out(nv, rows, px, add, tile, part + (long)g * {VW} * {howo} + obase + q0, {howo});
          }}
        }}
      }}
    }}
    if (by_rows) /* the strip's rows of C through the projection's epilogue */
      for (int ch = 0; ch < m2; ch++) {{
        float* out = part + (long)ch * {howo};
#pragma omp simd
        for (int j = (int)obase; j < (int)obase + npx; j++) {{
          float v = out[j];
{s3}          out[j] = {r3};
        }}
      }}
   }}
  }}
  if (!by_rows) {{
    const int bz = 0;
    plait_team_barrier();
    /* the partial sums added by output channel, then the epilogue */
#pragma omp for schedule(static) nowait
    for (int ch = 0; ch < m2; ch++) {{
      float* out = C + (long)ch * {howo};
#pragma omp simd
      for (int j = 0; j < {howo}; j++) {{
        float v = out[j];
        if (partial) {{
          v = 0.0f;
          for (int t = 0; t < threads; t++) v += parts[t * own + scratch + (long)ch * {howo} + j];
        }}
{s3}        out[j] = {r3};
      }}
    }}
  }}
"""
    params = [
        "float* restrict C",
        "const float* restrict X",
        *(["const float* restrict U1"] if p.expand else []),
        "const float* restrict UD",
        "const float* restrict U2",
        *prm1,
        *prm2,
        *prm3,
    ]
    lib = library()
    if p.stem is not None:  # the band split (shared with the stems' direct kernels) and the tap-offset tiles
        lib += gemm_c.at_o2(gemm_c.DIRECT_BAND) + gemm_c.at_o2(_stem_tiles(p.mr))
    src = entry_points("KERNEL_NAME", params, body, f"{lib}{WIDE}/* KERNEL_NAME */\n")
    digest = hashlib.sha256(src.encode()).hexdigest()[:10]
    stem = f"x{p.stem[1]}s{p.stem[3]}" if p.stem else ""
    name = f"IRBLOCK_{p.images}x{p.cin}{stem}x{p.c1 if p.expand else 0}x{p.m2}x{p.h}x{p.w}s{p.stride}_{digest}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), (1,), None)
