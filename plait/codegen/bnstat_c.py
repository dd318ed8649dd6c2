"""The cpu batch norm's per-channel statistics as C kernels that read each activation once.

The forward's mean and variance: per (image, channel) plane its sum and the square sum about the plane's own mean,
the plane read a second time from cache (a 56x56 plane is 12.5 KB), then the planes of a channel combined in double
precision by Chan's formula (M2 = sum of the planes' M2 + their counts times the squared distances of their means),
which, like the two passes it replaces, does not cancel when |mean| >> std. The backward's sums of g and of
g * (x - mean) in one pass over both, so that the forward need not store xhat for them. Both run along each plane
with two to four vectors of accumulators; the reductions they replace read the activation twice each way."""

from __future__ import annotations

from plait.codegen import gemm_c

_SOURCE = """//@shared-begin plait_bn_stats
/* The sum of p[0..n) with four vectors of partial sums. */
static inline float plait_bn_sum(const float* restrict p, long n) {
  plait_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  long i = 0;
  for (; i + 4 * PLAIT_VW <= n; i += 4 * PLAIT_VW) {
    a0 += *(const plait_vf*)(p + i);
    a1 += *(const plait_vf*)(p + i + PLAIT_VW);
    a2 += *(const plait_vf*)(p + i + 2 * PLAIT_VW);
    a3 += *(const plait_vf*)(p + i + 3 * PLAIT_VW);
  }
  for (; i + PLAIT_VW <= n; i += PLAIT_VW) a0 += *(const plait_vf*)(p + i);
  plait_vf a = (a0 + a1) + (a2 + a3);
  float s = 0.0f;
  for (int l = 0; l < PLAIT_VW; l++) s += a[l];
  for (; i < n; i++) s += p[i];
  return s;
}

/* The sum of (p[i] - m)^2 over p[0..n). */
static inline float plait_bn_centred(const float* restrict p, long n, float m) {
  plait_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, mv = m - (plait_vf){0};
  long i = 0;
  for (; i + 4 * PLAIT_VW <= n; i += 4 * PLAIT_VW) {
    plait_vf d0 = *(const plait_vf*)(p + i) - mv, d1 = *(const plait_vf*)(p + i + PLAIT_VW) - mv;
    plait_vf d2 = *(const plait_vf*)(p + i + 2 * PLAIT_VW) - mv, d3 = *(const plait_vf*)(p + i + 3 * PLAIT_VW) - mv;
    a0 += d0 * d0, a1 += d1 * d1, a2 += d2 * d2, a3 += d3 * d3;
  }
  for (; i + PLAIT_VW <= n; i += PLAIT_VW) {
    plait_vf d = *(const plait_vf*)(p + i) - mv;
    a0 += d * d;
  }
  plait_vf a = (a0 + a1) + (a2 + a3);
  float s = 0.0f;
  for (int l = 0; l < PLAIT_VW; l++) s += a[l];
  for (; i < n; i++) s += (p[i] - m) * (p[i] - m);
  return s;
}

/* out[ch] = the mean, out[c + ch] the biased variance and out[2 * c + ch] 1 / sqrt(variance + eps) of channel ch of
   x, whose plane (image n, channel ch) is the npos floats at x + n * sn + ch * sc. */
static void plait_bn_moments(const float* x, float* out, int images, int c, long npos, long sn, long sc, double eps) {
#pragma omp for schedule(static) nowait
  for (int ch = 0; ch < c; ch++) {
    double count = 0.0, mean = 0.0, m2 = 0.0;
    for (int n = 0; n < images; n++) {
      const float* p = x + n * sn + ch * sc;
      float pm = plait_bn_sum(p, npos) / (float)npos;
      double q = plait_bn_centred(p, npos, pm), d = (double)pm - mean, total = count + (double)npos;
      mean += d * (double)npos / total;
      m2 += q + d * d * count * (double)npos / total;
      count = total;
    }
    out[ch] = (float)mean;
    out[c + ch] = (float)(m2 / count);
    out[2 * c + ch] = (float)(1.0 / sqrt(m2 / count + eps));
  }
}

/* out[ch] = the sum of g and out[c + ch] the sum of g * (x - m[ch]) over channel ch: g is images x c x npos, x laid
   out as for plait_bn_moments. */
static void plait_bn_grad_sums(const float* g, const float* x, const float* m, float* out, int images, int c,
                               long npos, long sn, long sc) {
#pragma omp for schedule(static) nowait
  for (int ch = 0; ch < c; ch++) {
    double s = 0.0, t = 0.0;
    plait_vf mv = m[ch] - (plait_vf){0};
    for (int n = 0; n < images; n++) {
      const float* restrict gp = g + ((long)n * c + ch) * npos;
      const float* restrict xp = x + n * sn + ch * sc;
      plait_vf s0 = {0}, s1 = {0}, t0 = {0}, t1 = {0};
      long i = 0;
      for (; i + 2 * PLAIT_VW <= npos; i += 2 * PLAIT_VW) {
        plait_vf g0 = *(const plait_vf*)(gp + i), g1 = *(const plait_vf*)(gp + i + PLAIT_VW);
        s0 += g0, s1 += g1;
        t0 += g0 * (*(const plait_vf*)(xp + i) - mv), t1 += g1 * (*(const plait_vf*)(xp + i + PLAIT_VW) - mv);
      }
      for (; i + PLAIT_VW <= npos; i += PLAIT_VW) {
        plait_vf g0 = *(const plait_vf*)(gp + i);
        s0 += g0, t0 += g0 * (*(const plait_vf*)(xp + i) - mv);
      }
      plait_vf sv = s0 + s1, tv = t0 + t1;
      float ps = 0.0f, pt = 0.0f;
      for (int l = 0; l < PLAIT_VW; l++) ps += sv[l], pt += tv[l];
      for (; i < npos; i++) ps += gp[i], pt += gp[i] * (xp[i] - m[ch]);
      s += ps, t += pt;
    }
    out[ch] = (float)s;
    out[c + ch] = (float)t;
  }
}
//@shared-end
"""


def library() -> str:
    """The shared C code of the statistics kernels (after the GEMM library's common declarations)."""
    return gemm_c.at_o2(gemm_c.COMMON) + gemm_c.at_o2(_SOURCE)


def moments_call(images: int, c: int, npos: int, sn: int, sc: int, eps: float) -> str:
    """A kernel body: b0 (3 x c) = the mean, biased variance and 1 / sqrt(variance + eps) of each channel of b1
    (plane strides sn, sc)."""
    return f"  plait_bn_moments(b1, b0, {images}, {c}, {npos}L, {sn}L, {sc}L, {eps!r});\n"


def grad_sums_call(images: int, c: int, npos: int, sn: int, sc: int) -> str:
    """A kernel body: b0 (2 x c) = the per-channel sums of b1 and of b1 * (b2 - mean), b1 images x c x npos, b2 laid
    out with plane strides sn, sc, the means row 0 of b3."""
    return f"  plait_bn_grad_sums(b1, b2, b3, b0, {images}, {c}, {npos}L, {sn}L, {sc}L);\n"
