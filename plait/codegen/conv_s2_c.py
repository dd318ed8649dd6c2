"""Stride-2 3x3 convolutions on the cpu with the output channels across the vector lanes (inference).

resnet's downsampling 3x3 layers ran as implicit GEMMs whose gather (`plait_pack_win`) re-read every input value
nine times into packed panels on each call, at 1.2-1.6x ONNX Runtime's node time. This kernel is the stems' lanes
form (plait/codegen/gemm_c.py: `plait_dl_micro`, `plait_dc_band`, `plait_dl_store`) made for deep inputs: the
weights are packed once, at plan build, as panels of VW*CV output channels (`pointwise_weight`, the 1x1 lanes
packing); each task splits a band of input rows into the stride's even and odd columns once, so that a patch element's
PX output pixels are PX consecutive floats that the micro-kernel broadcasts; a panel's weights run in passes of
`gemm_c.DIRECT_LANES_KC_BYTES` that stay in L1 over every row of the band; the band's sums go back to the NCHW planes
through the VW x VW transposing store, and the fused epilogue runs on each panel's rows while they are in cache.
Tasks are (image, band of rows, run of panels), so one image's 14x14 or 28x28 plane still feeds both threads; where
panels are split, a thread takes one run of panels over every band (S2_CHUNK_MAJOR).
"""

from __future__ import annotations

from typing import Any

from plait.codegen import gemm_c
from plait.codegen.pointwise_c import LanesPlan

S2_BAND_ROWS = 8  # output rows per band at most: bands are as even as that allows (28 rows: 4 bands of 7)
# The same where the images alone give every thread S2_TASKS_PER_THREAD tasks (batch 16): a band is a whole plane of
# up to 28 rows, so a thread streams the weights (resnet50's layer3: 2.4 MB) once per image, not once per band of 8
# rows. `benchmarks/bench_kernel_pairs.py resnet50 --batch 16 --b conv_s2_c.S2_BATCH_BAND_ROWS=8 --prefix S2CONV`,
# two threads, paired per-round ratios of bands of 8 to these: layer2 1.043, layer3 1.019 (controls 1.001, 1.007);
# earlier runs the other way round 0.939/0.934 (resnet50), 0.977/0.965 (resnet18), 0.895/0.930 at one thread.
S2_BATCH_BAND_ROWS = 28
S2_TASKS_PER_THREAD = 2  # tasks per thread a call aims for when its images' bands are fewer
# With fewer bands than tasks wanted (batch 1), a call also splits the panels into runs; a thread's static run of
# tasks then covers one run of panels over every band (chunk-major) instead of every panel over its bands, so each
# thread streams only its share of the weights from memory (resnet50 b1's layer3 3x3/2: 2.4 MB, read by both threads
# before) and splits each band once more. `bench_far_ab.py resnet50`, two threads, against a control plan: that
# layer 2.31 -> 2.24 ms near and 2.27 -> 2.14 far (controls +0.04, +0.06); the others unchanged (docs/benchmarks.md).
S2_CHUNK_MAJOR = 1
S2_MIN_CIN = 16  # input channels from which the kernel runs (below, the stems' direct forms or the GEMM)
# Output pixels per image from which the kernel runs: on 7x7 output planes (resnet's layer4) it was level with the
# GEMM or behind (batch 1: 1.02-1.05x its time; batch 16: 0.96-1.07x inside whole replays, median 1.03, one
# thread), on 14x14 and 28x28 planes 0.69-0.93x (docs/benchmarks.md).
S2_MIN_PIXELS = 196


def fits(spec: Any) -> bool:
    """Whether convolution product `spec` runs here: a 3x3 window of stride 2 (dilation 1) over one weight for every
    image (no groups), its patch columns per image (not folded for a weight gradient), a whole number of
    gemm_c.VW-channel output vectors, at least S2_MIN_CIN input channels and S2_MIN_PIXELS output pixels per image."""
    win = spec.conv
    if win is None or win.fold or spec.a_nchw is not None:
        return False
    window = (win.kh, win.kw, win.sh, win.sw, win.dh, win.dw) == (3, 3, 2, 2, 1, 1)
    shared = spec.a[1] == 0 and spec.a_inner == 0
    wide = spec.n >= S2_MIN_PIXELS and spec.k // 9 >= S2_MIN_CIN
    return window and shared and wide and spec.m % gemm_c.VW == 0


def plan(spec: Any) -> LanesPlan:
    """The packing and register tile of `spec`: gemm_c.DIRECT_LANES_CV channel vectors times the pixel count that
    pads an output row least (the stems' rule), the weight view read by the packing."""
    ao, _, sam, sak = spec.a
    return LanesPlan(spec.m, spec.k, gemm_c.lanes_pixels(spec.conv.ow), gemm_c.DIRECT_LANES_CV, (ao, sam, sak))


DRIVER = """//@shared-begin plait_conv_s2_@CV@x@PX@
/* C[bz] (m x n, n = oh * ow) = the convolution of image bz with the packed weights U (panels of CW channels over
   k patch elements, zero past m), as tasks of (image, band of output rows, run of panels). A thread splits a band
   of input rows once for its consecutive tasks on that band; per panel, each pass of kc patch elements runs over
   every PX pixels of every row of the band into a tile (per PLAIT_VW-channel group: rows x TW pixels), which is
   then stored to C's planes transposed PLAIT_VW x PLAIT_VW at a time and given the epilogue. */
static void plait_conv_s2_@CV@x@PX@(long batch, long inner, int m, int n, int k, const float* U, const float* X,
                                  long sxb, long sxi, const plait_win* g, float* C, plait_epi_fn epi,
                                  void* const* extra) {
  enum { CV = @CV@, PX = @PX@, L = PLAIT_VW, CW = CV * L };
  int ow = g->ow, oh = n / ow, cin = k / (g->kh * g->kw), sw = g->sw, panels = (m + CW - 1) / CW;
  long want = @TPT@L * omp_get_num_threads();
  int most = batch >= want ? @BROWS@ : @ROWS@; /* rows per band at most: whole planes where images feed the threads */
  int nb = (oh + most - 1) / most, br = (oh + nb - 1) / nb;
  nb = (oh + br - 1) / br;
  int passes = (int)(((long)k * CW * 4 + @KCB@ - 1) / @KCB@), kc = (k + passes - 1) / passes;
  int TW = ((ow + PX - 1) / PX * PX + L - 1) / L * L;
  int R = (br - 1) * g->sh + (g->kh - 1) * g->dh + 1, T = (ow + PX - 1) / PX * PX + (g->kw - 1) * g->dw / sw;
  long chunks = batch * nb >= want ? 1 : (want + batch * nb - 1) / (batch * nb);
  if (chunks > panels) chunks = panels;
  size_t nbuf = ((size_t)cin * R * sw * T + 15) / 16 * 16, nt = (size_t)CW * br * TW;
  float* buf = plait_scratch(nbuf + nt + (size_t)k);
  float* tile = buf + nbuf;
  int* koff = (int*)(tile + nt);
  long have = -1;
  plait_dc_offsets(g, k, R, T, koff);
  @STEAL@ {
    long band = @CM@ ? task % (batch * nb) : task / chunks, bz = band / nb, ck = @CM@ ? task / (batch * nb) : task % chunks;
    int oy0 = (int)(band % nb) * br, rows = oh - oy0 < br ? oh - oy0 : br;
    int pa = (int)(panels * ck / chunks), pb = (int)(panels * (ck + 1) / chunks);
    if (band != have) {
      const float* x = X + bz / inner * sxb + bz % inner * sxi;
      plait_dc_band(x, g, cin, oy0 * g->sh, (rows - 1) * g->sh + (g->kh - 1) * g->dh + 1, R, T, buf);
      have = band;
    }
    float* c = C + bz * (long)m * n;
    for (int pn = pa; pn < pb; pn++) {
      const float* w = U + (long)pn * k * CW;
      int groups = (m - pn * CW) / L < CV ? (m - pn * CW) / L : CV;
      for (int p0 = 0; p0 < k; p0 += kc)
        for (int r = 0; r < rows; r++) {
          const float* src = buf + (long)r * g->sh * sw * T;
          for (int x0 = 0; x0 < ow; x0 += PX)
            plait_dl_micro_@CV@x@PX@(p0, p0 + kc < k ? p0 + kc : k, koff, src + x0, w,
                                     tile + ((long)r * TW + x0) * L, (long)br * TW * L);
        }
      for (int cg = 0; cg < groups; cg++)
        for (int r = 0; r < rows; r++) {
          float* d = c + (long)(pn * CW + cg * L) * n + (long)(oy0 + r) * ow;
          for (int x0 = 0; x0 < ow; x0 += L)
            plait_dl_store(tile + ((long)(cg * br + r) * TW + x0) * L, d + x0, n, ow - x0 < L ? ow - x0 : L);
        }
      if (epi) epi(c, bz, pn * CW, oy0 * ow, groups * L, rows * ow, extra);
    }
  }
}
//@shared-end
"""


def library(p: LanesPlan) -> str:
    """The shared C code of the stride-2 kernel with p's register tile (on gemm_c's band and lanes blocks)."""
    body = DRIVER.replace("@CV@", str(p.nv)).replace("@PX@", str(p.mr)).replace("@ROWS@", str(S2_BAND_ROWS))
    body = body.replace("@BROWS@", str(S2_BATCH_BAND_ROWS))
    body = body.replace("@KCB@", str(gemm_c.DIRECT_LANES_KC_BYTES)).replace("@TPT@", str(S2_TASKS_PER_THREAD))
    body = body.replace("@CM@", str(S2_CHUNK_MAJOR))
    body = body.replace("@STEAL@", gemm_c.steal_loop("task", "batch * nb * chunks"))
    band = gemm_c.at_o2(gemm_c.COMMON) + gemm_c.at_o2(gemm_c.DIRECT_BAND)
    return band + gemm_c.lanes_blocks(p.nv, p.mr) + gemm_c.at_o2(body)


def call(spec: Any, p: LanesPlan, image: str, epi_fn: str, extra: str) -> str:
    """The statements that run `spec` with weights packed for `p` (A) over the image (`image`: X, sxb, sxi)."""
    win = spec.conv
    return (
        f"{gemm_c.win_decl(win)}"
        f"  plait_conv_s2_{p.nv}x{p.mr}({spec.batch}, {spec.inner}, {spec.m}, {spec.n}, {spec.k}, A, {image}, &win, C,"
        f" {epi_fn}, {extra});\n"
    )
