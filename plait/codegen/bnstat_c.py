"""The cpu batch norm's per-channel statistics as C kernels that read each activation once.

The forward's mean and variance: per (image, channel) plane its sum and the square sum about the plane's own mean,
the plane read a second time from cache (a 56x56 plane is 12.5 KB), then the planes of a channel combined in double
precision by Chan's formula (M2 = sum of the planes' M2 + their counts times the squared distances of their means),
which, like the two passes it replaces, does not cancel when |mean| >> std. The backward's sums of g and of
g * (x - mean) in one pass over both, so that the forward need not store xhat for them. Both run along each plane
with 32-64 lanes of accumulators; the reductions they replace read the activation twice each way."""

from __future__ import annotations

from plait.codegen import gemm_c

_SOURCE = """//@shared-begin plait_bn_stats
/* The sum of p[0..n) with 64 lanes of partial sums. */
static inline float plait_bn_sum(const float* restrict p, long n) {
  plait_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
  long i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 += *(const plait_v16*)(p + i);
    a1 += *(const plait_v16*)(p + i + 16);
    a2 += *(const plait_v16*)(p + i + 32);
    a3 += *(const plait_v16*)(p + i + 48);
  }
  for (; i + 16 <= n; i += 16) a0 += *(const plait_v16*)(p + i);
  plait_v16 a = (a0 + a1) + (a2 + a3);
  float s = 0.0f;
  for (int l = 0; l < 16; l++) s += a[l];
  for (; i < n; i++) s += p[i];
  return s;
}

/* The sum of (p[i] - m)^2 over p[0..n). */
static inline float plait_bn_centred(const float* restrict p, long n, float m) {
  plait_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, mv = m - (plait_v16){0};
  long i = 0;
  for (; i + 64 <= n; i += 64) {
    plait_v16 d0 = *(const plait_v16*)(p + i) - mv, d1 = *(const plait_v16*)(p + i + 16) - mv;
    plait_v16 d2 = *(const plait_v16*)(p + i + 32) - mv, d3 = *(const plait_v16*)(p + i + 48) - mv;
    a0 += d0 * d0, a1 += d1 * d1, a2 += d2 * d2, a3 += d3 * d3;
  }
  for (; i + 16 <= n; i += 16) {
    plait_v16 d = *(const plait_v16*)(p + i) - mv;
    a0 += d * d;
  }
  plait_v16 a = (a0 + a1) + (a2 + a3);
  float s = 0.0f;
  for (int l = 0; l < 16; l++) s += a[l];
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
    plait_v16 mv = m[ch] - (plait_v16){0};
    for (int n = 0; n < images; n++) {
      const float* restrict gp = g + ((long)n * c + ch) * npos;
      const float* restrict xp = x + n * sn + ch * sc;
      plait_v16 s0 = {0}, s1 = {0}, t0 = {0}, t1 = {0};
      long i = 0;
      for (; i + 32 <= npos; i += 32) {
        plait_v16 g0 = *(const plait_v16*)(gp + i), g1 = *(const plait_v16*)(gp + i + 16);
        s0 += g0, s1 += g1;
        t0 += g0 * (*(const plait_v16*)(xp + i) - mv), t1 += g1 * (*(const plait_v16*)(xp + i + 16) - mv);
      }
      for (; i + 16 <= npos; i += 16) {
        plait_v16 g0 = *(const plait_v16*)(gp + i);
        s0 += g0, t0 += g0 * (*(const plait_v16*)(xp + i) - mv);
      }
      plait_v16 sv = s0 + s1, tv = t0 + t1;
      float ps = 0.0f, pt = 0.0f;
      for (int l = 0; l < 16; l++) ps += sv[l], pt += tv[l];
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
