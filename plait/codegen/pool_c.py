"""The C max-pooling kernel: each output row of a plane reads its window rows straight from the input, the
columns whose windows lie inside the image in one vectorised loop with every tap's offset a compile-time constant
(resnet's 3x3 stride-2 stem pool: nine strided loads per vector of outputs), the few edge columns with bounds tests.
Planes are shared among threads. It replaces the fused chain of kh*kw strided views of a padded input, whose
padding became clamps and selects on every tap of every output (1.5 ms against ONNX Runtime's 0.3 ms per image)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PoolGeometry:
    """A 2-D max pool over an (N, C, H, W) input; (oh, ow) may include ceil-mode windows that hang past the far
    edge (their missing cells never win, as with -inf padding)."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    oh: int
    ow: int

    def inner_cols(self) -> tuple[int, int]:
        """Output columns [lo, hi) whose window columns all lie inside the input."""
        lo = min(self.ow, -(-self.pw // self.sw))
        last = self.w - 1 - (self.kw - 1) * self.dw + self.pw  # the largest ox * sw that keeps the last tap inside
        hi = min(self.ow, last // self.sw + 1) if last >= 0 else 0
        return lo, max(lo, hi)


# NaN propagates as in the fused chain of maximum ops (and PyTorch): once the running maximum is NaN it stays. The
# test costs three instructions per tap (3x the kernel's time), so while the input rows read so far hold no NaN the
# plain maximum runs, which gives the same bits there (the same comparison in the same tap order).
_MAX_NAN = "m = (m > v || m != m) ? m : v;"
_MAX = "m = m > v ? m : v;"


def _columns(g: PoolGeometry, rows: str, op: str) -> list[str]:
    """C lines: outputs [lo, hi) of row `o` (windows inside the image's columns) as one vectorised loop, each the
    maximum over kernel rows `rows` (a loop header) of the taps at `x[ro[ky] + ox * sw + kx * dw]`, taken with `op`."""
    lo, hi = g.inner_cols()
    return [
        "#pragma omp simd",
        f"for (int ox = {lo}; ox < {hi}; ox++) {{",
        "  float m = -INFINITY;",
        f"#pragma GCC unroll {g.kh}",
        f"  for ({rows}) {{",
        f"#pragma GCC unroll {g.kw}",
        f"    for (int kx = 0; kx < {g.kw}; kx++) {{ float v = x[ro[ky] + ox * {g.sw} + kx * {g.dw}]; {op} }}",
        "  }",
        "  o[ox] = m;",
        "}",
    ]


def render(r: Any, g: PoolGeometry) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
    """The body of the max-pool kernel (b0: output, b1: input, both float32), its loop over planes shared among
    threads by the renderer's `parallel_for`."""
    lo, hi = g.inner_cols()
    edge = [
        "{",
        "  float m = -INFINITY;",
        "  for (int ky = ky0; ky < ky1; ky++)",
        f"    for (int kx = 0; kx < {g.kw}; kx++) {{",
        f"      int ix = ox * {g.sw} - {g.pw} + kx * {g.dw};",
        f"      if (ix >= 0 && ix < {g.w}) {{ float v = x[ro[ky] + {g.pw} + ix]; {_MAX_NAN} }}",
        "    }",
        "  o[ox] = m;",
        "}",
    ]
    some, every = "int ky = ky0; ky < ky1; ky++", f"int ky = 0; ky < {g.kh}; ky++"
    body = [
        f"const float* x = b1 + pl * {g.h * g.w}L;",
        "int nan = 0, done = 0; /* input rows [0, done) are tested for NaN, each just before its first use */",
        f"for (int oy = 0; oy < {g.oh}; oy++) {{",
        f"  int y0 = oy * {g.sh} - {g.ph}, ky0 = 0, ky1 = {g.kh};",
        f"  while (ky0 < ky1 && y0 + ky0 * {g.dh} < 0) ky0++;",
        f"  while (ky1 > ky0 && y0 + (ky1 - 1) * {g.dh} >= {g.h}) ky1--;",
        f"  int need = ky1 > ky0 ? y0 + (ky1 - 1) * {g.dh} + 1 : 0;",
        "  if (need > done) {",
        "#pragma omp simd reduction(|:nan)",
        f"    for (long i = (long)done * {g.w}; i < (long)need * {g.w}; i++) nan |= x[i] != x[i];",
        "    done = need;",
        "  }",
        f"  long ro[{g.kh}];",
        f"  for (int ky = 0; ky < {g.kh}; ky++) ro[ky] = (long)(y0 + ky * {g.dh}) * {g.w} - {g.pw};",
        f"  float* restrict o = b0 + (pl * {g.oh} + oy) * {g.ow}L;",
        f"  for (int ox = 0; ox < {lo}; ox++)",
        *("  " + ln for ln in edge),
        "  if (nan) {",
        *("    " + ln for ln in _columns(g, some, _MAX_NAN)),
        f"  }} else if (ky0 == 0 && ky1 == {g.kh}) {{",
        *("    " + ln for ln in _columns(g, every, _MAX)),
        "  } else {",
        *("    " + ln for ln in _columns(g, some, _MAX)),
        "  }",
        f"  for (int ox = {hi}; ox < {g.ow}; ox++)",
        *("  " + ln for ln in edge),
        "}",
    ]
    return r.parallel_for("pl", g.n * g.c, body, "long", g.n * g.c * g.oh * g.ow * g.kh * g.kw)
