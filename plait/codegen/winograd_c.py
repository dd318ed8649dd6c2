"""Winograd convolution for the C device: 3x3 (and 5x5), stride-1 convolutions with fewer multiplies than the
implicit GEMM.

F(m, 3) computes an m x m output tile from an (m+2) x (m+2) input tile with (m+2)^2 products per channel pair instead
of 9 m^2 (F(4, 3): 36 instead of 144, a 4x cut; F(2, 3): 16 instead of 36, 2.25x). Per block of tiles the kernel
transforms the input tiles of every channel (V = B^T d B, laid out as the GEMM library's packed panels), runs
(m+2)^2 products of the transformed weights U[xi] (K x C, prepared once by a separate kernel) with V[xi], and turns
each channel row block back into output tiles (Y = A^T M A) followed by the GEMM epilogue (bias, BN, ReLU,
residual) while the tiles are in cache. The product loop is the C GEMM's register-tiled micro-kernel
(gemm_c.py), so the multiplies run at the same rate as the implicit GEMM's; what Winograd adds is transform work
and memory traffic (U is (m+2)^2 / 9 times the weight), which is why `pick` uses it only for layers where it was
measured to win.

5x5 layers run F(2, 5) (a plan's `r` = 5; its matrices are winograd_cl.F25): 6x6 input tiles like F(4, 3)'s, 36
products per 2x2 outputs instead of 100, through the same transforms' code, driver and micro-kernel.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from plait import settings
from plait.codegen import gemm, gemm_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.errors import PlaitError

_Mat = tuple[tuple[Fraction, ...], ...]


def _mat(rows: list[list[Any]]) -> _Mat:
    return tuple(tuple(Fraction(v) for v in row) for row in rows)


# Lavin & Gray's transforms, interpolation points 0, +-1, (+-2,) infinity: y = A^T [(G g) * (B^T d)] for a 1-D
# correlation of an (m+2)-long input d with a 3-tap filter g; the 2-D form nests it over rows and columns.
TRANSFORMS: dict[int, tuple[_Mat, _Mat, _Mat]] = {
    2: (
        _mat([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
        _mat([[1, 0, 0], ["1/2", "1/2", "1/2"], ["1/2", "-1/2", "1/2"], [0, 0, 1]]),
        _mat([[1, 1, 1, 0], [0, 1, -1, -1]]),
    ),
    4: (
        _mat(
            [
                [4, 0, -5, 0, 1, 0],
                [0, -4, -4, 1, 1, 0],
                [0, 4, -4, -1, 1, 0],
                [0, -2, -1, 2, 1, 0],
                [0, 2, -1, -2, 1, 0],
                [0, 4, 0, -5, 0, 1],
            ]
        ),
        _mat(
            [
                ["1/4", 0, 0],
                ["-1/6", "-1/6", "-1/6"],
                ["-1/6", "1/6", "-1/6"],
                ["1/24", "1/12", "1/6"],
                ["1/24", "-1/12", "1/6"],
                [0, 0, 1],
            ]
        ),
        _mat([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]),
    ),
}

V_BUDGET = 8 << 20  # bytes of transformed input tiles held at once (a chunk of tile blocks)
TARGET_TILES = 128  # most tiles per block: their transformed inputs (one panel row per channel) stay in L2
MIN_CHANNELS = 32  # fewer input or output channels stay on the implicit GEMM
# output positions (batch x plane) that pay for a weight transform on every call (a training step's weights, a
# torch.compile partition's lifted parameters). At 784, one thread, F(4,3) with its transform against the implicit
# GEMM: resnet18 b16 layer4's 512-channel 7x7 input gradient 41.4 against 57.1 ms, 256 channels 7x7 b16 14.5 against
# 16.9, 128 channels 28x28 b1 3.7 against 4.2, 64 channels 28x28 b1 0.62 against 1.04 (docs/benchmarks.md, "cpu
# training step: layer4 by Winograd")
PER_CALL_MIN_POSITIONS = 784
# fewest output tiles for each tile size: F(2,3) needs one 16-wide vector of tiles. F(4,3), whose U is 2.25x F(2,3)'s,
# once lost to F(2,3) on 16 tiles (14x14 at batch 1: 1.45x against 1.67x over the implicit GEMM, on an earlier host);
# on the Zen 3 guest it wins there: batch 1, two threads, per-round ratios of each kernel's span inside whole replays
# (benchmarks/bench_flag_ab.py --steps, F(4,3) / F(2,3)): resnet50's and resnet18's 256-channel 14x14 layers
# 0.90-0.95, alexnet's 13x13 layers 0.88-0.92, vgg16's 512-channel 14x14 layers (a 38 MB U each) 0.94-0.95; whole
# resnet50 replays 0.987 and 0.980 in the two orders (docs/benchmarks.md, twenty-first session). 7x7 planes (4 tiles)
# stay on F(2,3). With 16-float vectors (the AVX-512 hosts the earlier measurement came from) the old bound stays.
MIN_TILES_F4 = 32 if gemm_c.VW == 16 else 16
MIN_TILES_F2 = 16
# fewest F(2,3) tiles for a U that leaves L2 (`_tile_m`). With 8-float vectors the implicit GEMM of resnet50's
# 512-channel 7x7 layers runs further below the core's peak than with 16, and F(2,3) wins there too: two threads,
# bench_far_ab.py, the two layers 3.9 -> 3.0 ms near, replays 0.957 near (8 of 8 windows) and 0.936 far (3 of 3) on
# the Zen 3 guest (docs/benchmarks.md, fourteenth session)
F2_BIG_U_TILES = 2 * MIN_TILES_F2 if gemm_c.VW == 16 else MIN_TILES_F2
# F(2, 5) only where the weight transform runs once per plan: an inference layer, alexnet's 64 -> 192 5x5 (the
# only 5x5 layer among the benchmark nets) measured with constant weights, never in a training step
R5_MIN_CHANNELS = 32
U_CACHED = 1 << 20  # bytes of transformed weights that stay in L2 from one tile block to the next
# the product of tile element xi prefetches U's rows of element xi + U_AHEAD (a run of mr rows kp rows away) with
# locality hint U_LOCALITY (3: into L1). In a replay each layer's U comes from memory (resnet18's weights exceed the
# 32 MB L3); its runs, tens of KB apart, were each found by the hardware prefetcher only after their first misses.
# resnet18 b1 on the Zen 5 host, replays in one process: 1 thread 15.58 -> 14.32 ms, 2 threads 7.89 -> 7.47 ms; two
# elements ahead lost to one (1.4%), the L2 hint to L1 (2.4%)
U_AHEAD = 1
U_LOCALITY = 3
# V is shared by the team: each thread transforms a share of the channels and every product task reads all of it, so
# a call's transform writes lines the other core read in the last call. Each channel's transform first asks for its
# lines with write intent (prefetchw), so that taking them from the other core overlaps the gather instead of
# stalling the stores: when the host places the two vCPUs on different CCDs (no shared L3) that costs ~5 ns a line
# more than a local write. resnet50 b1 two threads, benchmarks/bench_far_ab.py: far placement 21.75 -> 21.41 ms
# (layer3's 14x14 F(2,3) layers 2.61 -> 2.49 ms), near 18.85 -> 18.88 ms (docs/benchmarks.md).
V_PREFETCHW = True
# U in the micro-kernel's blocked panels (gemm_c's apk 2): the mr rows of a register tile over VW input channels at a
# time, element (i, c) of a panel at c / VW * VW * mr + i * VW + c % VW. A product then reads U as one sequential run
# instead of mr rows ldu apart. With few tiles (batch 1's 14x14 and 7x7 planes: 16) each U element serves 16 columns,
# so U's stream from memory sets the pace. The weight transform still stores a vector of channels per instruction.
# Two threads, per-round ratios inside whole replays (bench_flag_ab.py --steps, packed / rows, 12-20 rounds):
# - resnet50 b1: 14x14 F(4,3) layers 0.89-0.94, 7x7 F(2,3) 0.93-0.94, 28x28 0.92-0.94, 56x56 0.96-0.99;
# - resnet18 b1: sum of spans 0.955; alexnet b1 0.968 (its 13x13 layers 0.76-0.94); vgg16 b1 1.000;
# - resnet18's b16 training step: the Winograd kernels 296-329 against 339-352 ms, weight transforms unchanged.
# Whole resnet50 b1 replays: 0.956 and 0.975 in the two orders (docs/benchmarks.md, twenty-second session).
U_PACKED = True


@dataclass(frozen=True)
class WinogradPlan:
    """How one convolution runs: tile size m, register tile (mr, nv), tile rows per block, and the geometry (batch n,
    channels c in, k out with kp = k rounded up to mr, image h x w, output oh x ow, padding) plus the weight view
    (offset, row stride, tap stride) that the weight transform reads."""

    m: int
    mr: int
    nv: int
    rpb: int
    n: int
    c: int
    k: int
    h: int
    w: int
    oh: int
    ow: int
    ph: int
    pw: int
    w_view: tuple[int, int, int]
    r: int = 3

    @property
    def alpha(self) -> int:
        return self.m + self.r - 1

    @property
    def tag(self) -> str:
        """The C names' tile part: f2 and f4 for F(2, 3) and F(4, 3) (as they always were), f2r5 for F(2, 5)."""
        return _tag(self.m, self.r)

    @property
    def kp(self) -> int:
        return -(-self.k // self.mr) * self.mr

    @property
    def th(self) -> int:
        return -(-self.oh // self.m)

    @property
    def tw(self) -> int:
        return -(-self.ow // self.m)

    @property
    def tbp(self) -> int:
        """Tile columns of a block, padded to whole panels of the micro-kernel's width."""
        nr = self.nv * gemm_c.VW
        return -(-self.rpb * self.tw // nr) * nr

    @property
    def ldu(self) -> int:
        """Row stride of U: C, padded where C is a multiple of 128 floats, so the micro-kernel's rows of U do not
        fall into the same L1 sets (a power-of-two stride maps every fourth or eighth row to one set). Packed
        (U_PACKED), a panel's channels rounded up to whole vectors: a panel is mr * ldu floats."""
        if U_PACKED:
            return -(-self.c // gemm_c.VW) * gemm_c.VW
        return self.c + 16 if self.c % 128 == 0 else self.c

    @property
    def slab(self) -> int:
        """Floats from one tile element's U to the next. Packed, one line more than its panels: those are often a
        whole number of 4 KB pages (resnet's 512 x 512: 516 x 512 floats), and the weight transform writes all
        alpha^2 elements at once, whose stores would then share L1 sets."""
        return self.kp * self.ldu + (16 if U_PACKED else 0)

    @property
    def u_shape(self) -> tuple[int, ...]:
        return (self.alpha * self.alpha, self.slab) if U_PACKED else (self.alpha * self.alpha, self.kp, self.ldu)


def _tag(m: int, r: int) -> str:
    return f"f{m}" if r == 3 else f"f{m}r{r}"


def _matrices(m: int, r: int) -> tuple[_Mat, _Mat, _Mat]:
    """(B^T, G, A^T) of F(m, r): F(2, 3) and F(4, 3) from TRANSFORMS, F(2, 5) from winograd_cl (defined once there,
    with the OpenCL kernels that first used it; imported here because winograd_cl imports this module)."""
    if r == 3 and m in TRANSFORMS:
        return TRANSFORMS[m]
    if (m, r) == (2, 5):
        from plait.codegen.winograd_cl import F25

        return F25
    raise PlaitError(f"Winograd F({m}, {r}): the C kernels have F(2, 3), F(4, 3) and F(2, 5); use PLAIT_WINOGRAD=off")


def eligible(spec: Any) -> bool:
    """True when `spec` (a GemmSpec) is an implicit-GEMM convolution Winograd can run: 3x3 or 5x5 taps, stride 1, no
    dilation, one group, a weight shared by every image and read as (K, C*r*r) rows."""
    win = spec.conv
    if win is None or getattr(win, "fold", False) or win.kh != win.kw or win.kh not in (3, 5):
        return False
    r = win.kh
    if (win.sh, win.sw, win.dh, win.dw) != (1, 1, 1, 1):
        return False
    _, sab, sam, sak = spec.a
    return (
        spec.batch == win.n
        and spec.n == win.oh * win.ow
        and spec.k == win.c * r * r
        and sab == 0
        and spec.a_inner == 0
        and sak == 1
        and sam >= spec.k
        and win.ph <= r - 1
        and win.pw <= r - 1
    )


def _tile_m(spec: Any, constant_weight: bool) -> int | None:
    """The Winograd tile size for an eligible convolution, from the per-layer measurements recorded in
    docs/benchmarks.md ("CPU: Winograd for 3x3 convolutions"), or the PLAIT_WINOGRAD setting when it forces one."""
    mode = settings.get("PLAIT_WINOGRAD")
    win = spec.conv
    if mode not in ("auto", "off", "2", "4"):
        raise PlaitError(
            f"{win.kh}x{win.kw} convolution {win.n}x{win.c}x{win.h}x{win.w} -> {spec.m} channels:"
            f" PLAIT_WINOGRAD={mode!r} is not one of auto, off, 2, 4; unset it for the per-layer choice"
        )
    if mode == "off":
        return None
    if win.kh == 5:
        # F(2, 5), the only 5x5 tile, keeps its own rule whatever 3x3 tile a forced 2 or 4 picks
        if not constant_weight or min(win.c, spec.m) < R5_MIN_CHANNELS:
            return None
        return 2 if win.n * -(-win.oh // 2) * -(-win.ow // 2) >= MIN_TILES_F2 else None
    if mode in ("2", "4"):
        return int(mode)
    if win.c < MIN_CHANNELS or spec.m < MIN_CHANNELS:
        return None  # few channels: the transforms cost about as much as the multiplies they save
    if not constant_weight and win.n * win.oh * win.ow < PER_CALL_MIN_POSITIONS:
        return None  # a weight transform on every call costs more than a small output saves
    tiles = {m: win.n * -(-win.oh // m) * -(-win.ow // m) for m in (2, 4)}
    # F(4, 3) wins wherever there are enough tiles to share U (4x the weight) over, 14x14 outputs at batch 1 (16)
    # included with 8-float vectors; 7x7 ones have 4, so they take F(2, 3) (16 tiles), and fewer still stay on the GEMM
    if tiles[4] >= MIN_TILES_F4:
        return 4
    if tiles[2] >= MIN_TILES_F2:
        # with one panel of tiles every U element meets only 16 columns, so a U that leaves L2 is read at memory speed:
        # there the implicit GEMM, whose weight is 16/9 times smaller, wins (512-channel 7x7 at batch 1, one thread:
        # 3.0-3.9 against 3.3-4.3 ms since the GEMM's fringe columns; docs/benchmarks.md "CPU: resnet18 and resnet50")
        if tiles[2] < F2_BIG_U_TILES and 16 * spec.m * win.c * 4 > U_CACHED:
            return None
        return 2
    return None


SHALLOW_C = 64  # products over at most this many input channels avoid the 24x1 register tile
# per-multiply-add cost of each register tile (by rows) in deep products (over more than SHALLOW_C channels) of layers
# with fewer than TARGET_TILES tiles in all (batch 1's 14x14 and 28x28 planes): one thread, each kernel alone, resnet18
# b1 on the Zen 5 host, time over padded work (columns x rows of U) against 12x2's: 256 channels 14x14 F(2,3) 24x1
# 1.34, 8x3 1.00, 6x4 1.08; 128 channels 28x28 F(4,3) 1.32, 0.96, 1.02. The broadcast-bound 24x1 tile was the cheapest
# on the Sapphire Rapids host, and the 6x4 tile the pick for 256 channels at 14x14 (0.72 against 0.68 ms as 12x2)
SMALL_BLOCK_COST = {24: 1.33, 12: 1.0, 8: 1.0, 6: 1.05}
# the team's threads that a layer's product tasks (blocks x row groups) are priced to split evenly over: resnet50 b1's
# 128-channel 28x28 F(4,3) took 12x2 (11 tasks, 6:5 over two threads: the second waited 0.05 ms per layer)
TEAM_SPLIT = gemm_c.PRICED_THREADS


def _tile_factor(mr: int, c: int, tiles: int, layer_tiles: int) -> float:
    """Relative cost per multiply-add of the register tile with `mr` rows in a product over `c` input channels, for a
    block of `tiles` tile columns in a layer of `layer_tiles`. Measured one thread, interleaved: 64 channels F(4,3)
    56x56 24x1 -> 8x3 1.65 -> 1.39 ms and 224x224 40.7 -> 29.4 ms (6x4); 128 and 256 channels at 112x112 and 56x56
    ran 7% slower as 12x2 than as 24x1. Over full blocks of deep products the 6- and 8-row tiles lost to 24x1 and 12x2 by 10-20% (alexnet's 13x13
    and resnet's 256-channel 14x14 layers at batch 16: 6x4 59.3, 36.9, 33.8 ms against 24x1 50.5, 29.6, 28.7), while
    on batch 1's 49-tile blocks 6x4 stayed ahead (2.02 against 2.21 ms). Those were a 2-core Sapphire Rapids; on a
    Zen 5 (1 MB L2) deep products over layers of fewer than TARGET_TILES tiles cost SMALL_BLOCK_COST. All of that is
    AVX-512's tiles; with narrower vectors the tiles are gemm_c's 16-register ones, priced by their micro-kernel rates
    (gemm_c.TILE_COST)."""
    if gemm_c.VW != 16:
        return gemm_c.TILE_COST[(mr, dict(gemm_c.TILES)[mr])]
    if c > SHALLOW_C and layer_tiles < TARGET_TILES:
        return SMALL_BLOCK_COST[mr]
    if mr == 24:
        return gemm_c.TILE_COST[(24, 1)] if c <= SHALLOW_C else 1.0
    if mr < 12 and c > SHALLOW_C and tiles >= TARGET_TILES:
        return 1.1
    return 1.02


def _tail(nv: int) -> bool:
    """Whether a block's partial last panel of at most VW tiles runs on gemm_c's one-vector tail kernel rather than the
    whole tile over zero columns: with narrower vectors than AVX-512's (whose tiles and blocks were tuned with whole
    panels on hosts not measurable here). Batch 1's 7x7 tile grids (49 tiles) then cost 56 columns, not 64, as 6x2."""
    return gemm_c.VW != 16 and nv > 1 and gemm_c.TAIL_VECTORS >= 1


# what a column of the one-vector tail kernel costs against a whole panel's: 6x1of2 against 6x2 per column, one thread,
# perf samples on the Zen 3 guest: resnet's 128-channel 28x28 F(4,3) layer 1.30, 64-channel 56x56 1.38 (half the
# accumulators a 6x2 tile has, so the multiply-adds' latency shows)
TAIL_COST = 1.35


def _padded(tiles: int, nv: int) -> float:
    """The columns a block of `tiles` tiles computes with the nv-vector register tile, the tail's weighted by TAIL_COST
    (_tail)."""
    nr = nv * gemm_c.VW
    if _tail(nv) and 0 < tiles % nr <= gemm_c.VW:
        return tiles // nr * nr + gemm_c.VW * TAIL_COST
    return -(-tiles // nr) * nr


def _split_loss(tasks: int) -> float:
    """How much longer than an even share the busiest of TEAM_SPLIT threads runs on `tasks` equal product tasks
    (statically split: ceil(tasks / threads) against tasks / threads)."""
    return gemm_c.static_busiest([1] * tasks, TEAM_SPLIT) * TEAM_SPLIT / tasks


def pick(spec: Any, constant_weight: bool = True) -> WinogradPlan | None:
    """A Winograd plan for the convolution GEMM `spec`, or None where the implicit GEMM is the better choice.
    `constant_weight`: the weight transform runs once per plan, not on every call."""
    if not eligible(spec):
        return None
    m = _tile_m(spec, constant_weight)
    if m is None:
        return None
    win = spec.conv
    k, c, r = spec.m, win.c, win.kh
    tw, rows = -(-win.ow // m), win.n * -(-win.oh // m)
    best: tuple[float, int, int, int] | None = None
    for mr, nv in gemm_c.TILES:
        kp = -(-k // mr) * mr
        # a block re-reads all of U: beyond what stays in L2 next to V, streaming it costs about 6/tiles of the
        # block's product time (L3 bandwidth against the micro-kernel's rate, measured on the 2-core Xeon)
        streamed = (m + r - 1) ** 2 * kp * c * 4 > U_CACHED
        for rpb in range(1, rows + 1):
            if rpb > 1 and rpb * tw > TARGET_TILES:
                break
            blocks = -(-rows // rpb)
            last = rows - (blocks - 1) * rpb
            cols = (blocks - 1) * _padded(rpb * tw, nv) + _padded(last * tw, nv)
            # padded product work plus U traffic; then the 24-row tile (fewest loads per multiply-add), except over
            # a shallow depth (products over <= SHALLOW_C channels), where it cost 1.2-1.4x the others (docs/benchmarks.md)
            factor = _tile_factor(mr, c, min(rpb, rows) * tw, rows * tw)
            cost = (cols * kp + (6 * blocks * kp if streamed else 0)) * factor * _split_loss(blocks * (kp // mr))
            if best is None or cost < best[0]:
                best = (cost, mr, nv, rpb)
    assert best is not None
    _, mr, nv, rpb = best
    ao, _, sam, sak = spec.a
    return WinogradPlan(m, mr, nv, rpb, win.n, c, k, win.h, win.w, win.oh, win.ow, win.ph, win.pw, (ao, sam, sak), r)


def _lit(f: Fraction) -> str:
    return f"{float(f)!r}f"


def _lin(coeffs: tuple[Fraction, ...], terms: list[str]) -> str:
    """The C expression sum(coeffs[i] * terms[i]) with unit coefficients as plain adds and subtractions."""
    out = ""
    for cf, t in zip(coeffs, terms, strict=True):
        if cf == 0:
            continue
        if cf == 1:
            out += f" + {t}"
        elif cf == -1:
            out += f" - {t}"
        else:
            out += f" + {_lit(cf)} * {t}"
    out = out.removeprefix(" + ")
    return f"({out})" if out else "0.0f"


def _sandwich(
    mat: _Mat, src: list[list[str]], tmp: str, indent: str, ctype: str = "float"
) -> tuple[list[str], list[list[str]]]:
    """Statements computing mat @ src @ mat^T (src a q x q grid of C expressions of type `ctype`) and the p x p
    result names."""
    p, q = len(mat), len(mat[0])
    lines = []
    for a in range(p):
        for v in range(q):
            lines.append(f"{indent}{ctype} {tmp}r{a}_{v} = {_lin(mat[a], [src[u][v] for u in range(q)])};")
    out = [[f"{tmp}{a}_{b}" for b in range(p)] for a in range(p)]
    for a in range(p):
        for b in range(p):
            lines.append(f"{indent}{ctype} {out[a][b]} = {_lin(mat[b], [f'{tmp}r{a}_{v}' for v in range(q)])};")
    return lines, out


def _gather(m: int, al: int) -> str:
    """Statements storing, for each tile element column v < al, VW tiles' elements row[m * tx + v] (tx < VW) of one
    zero-padded input row chunk `s` into P: the row's m vectors (and m more loaded m, 2m, ... floats further on, for
    v >= m) are deinterleaved with two-source shuffles instead of VW strided scalar copies."""
    names, vw = "xyz", gemm_c.VW
    lines = [
        f"        plait_vf {names[q]}{i} = *(const plait_vf*)(s + {q * m + vw * i if q else vw * i});"
        for q in range(-(-al // m))
        for i in range(m)
    ]
    for v in range(al):
        src, vv = names[v // m], v % m
        if m == 2:
            idx = [vv + 2 * i for i in range(vw // 2)] + [vw + vv + 2 * i for i in range(vw // 2)]
            expr = f"PLAIT_WSHUF({src}0, {src}1, {', '.join(map(str, idx))})"
            lines.append(f"        *(plait_vf*)(p + {v} * pp) = {expr};")
            continue
        # m == 4: each pair of vectors holds VW / 4 tiles, deinterleaved into half a vector, then the halves joined
        half = [vv + 4 * i for i in range(vw // 4)] + [vw + vv + 4 * i for i in range(vw // 4)] + [0] * (vw // 2)
        h = ", ".join(map(str, half))
        lines.append(
            f"        plait_vf lo{v} = PLAIT_WSHUF({src}0, {src}1, {h}), hi{v} = PLAIT_WSHUF({src}2, {src}3, {h});"
        )
        both = ", ".join(map(str, [*range(vw // 2), *range(vw, vw + vw // 2)]))
        lines.append(f"        *(plait_vf*)(p + {v} * pp) = PLAIT_WSHUF(lo{v}, hi{v}, {both});")
    return "\n".join(lines)


def _transforms(m: int, r: int) -> str:
    """The input and output tile transforms for F(m, r), in explicit vectors of VW tiles of a block (the block's tile
    columns are padded to whole panels, so every vector is full)."""
    bt, _, at = _matrices(m, r)
    al, vf, f, vw = m + r - 1, "plait_vf", _tag(m, r), gemm_c.VW
    src_in = [[f"*(const {vf}*)(P + {u * al + v} * pp + j)" for v in range(al)] for u in range(al)]
    lines_in, v_out = _sandwich(bt, src_in, "t", "    ", vf)
    stores_in = [f"    *({vf}*)(d + {a * al + b} * xs) = {v_out[a][b]};" for a in range(al) for b in range(al)]
    src_out = [[f"*(const {vf}*)(mb + {u * al + v} * ms + j)" for v in range(al)] for u in range(al)]
    lines_out, y_out = _sandwich(at, src_out, "o", "      ", vf)
    stores_out = [f"      *({vf}*)(O + {a * m + b} * tbp + j) = {y_out[a][b]};" for a in range(m) for b in range(m)]
    body_in = "\n".join(lines_in + stores_in)
    body_out = "\n".join(lines_out + stores_out)
    return f"""//@shared-begin plait_wino_{f}
/* Input tiles of channel c for tile rows [r0, r1) (row R = image R / th, tile row R % th) into the block's
   panels: tile j of the block is panel column j % nr of panel j / nr, element xi of the tile at stride xs. */
__attribute__((noinline)) static void plait_wino_in_{f}(const float* x, const plait_wino_geo* g, long r0, long r1,
                                                        int c, float* V, int nr) {{
  int tw = g->tw, tbp = g->tbp, tiles = (int)(r1 - r0) * tw, used = (tiles + nr - 1) / nr * nr;
  /* P's rows have VW columns of slack: a tile row's last VW-tile store may run past its tiles (the next tile row,
     or the zeroing below, overwrites those columns); an input row holds whole VW-tile chunks and 16 floats more (the
     gather's loads for v >= m read up to 4 past a chunk) */
  int pp = tbp + {vw}, chunks = (tw + {vw - 1}) / {vw}, pitch = chunks * {vw * m} + 16, wp = tw * {m} + {al - m};
  long xs = (long)(tbp / nr) * g->c * nr + PLAIT_WINO_SKEW;
  float P[{al * al} * pp] __attribute__((aligned(64))), rb[{al} * pitch] __attribute__((aligned(64)));
  if ({int(V_PREFETCHW)}) /* this channel's lines of V, with write intent (V_PREFETCHW) */
    for (int j = 0; j < used; j += {vw}) /* every VW columns: each line, and each 8-wide panel's half line */
      for (int e = 0; e < {al * al}; e++) __builtin_prefetch(V + ((long)(j / nr) * g->c + c) * nr + j % nr + e * xs, 1, 3);
  for (int u = 0; u < {al}; u++) memset(rb + u * pitch + wp, 0, sizeof(float) * (pitch - wp)); /* read, never used */
  for (long R = r0; R < r1; R++) {{
    int n = (int)(R / g->th), ty = (int)(R % g->th), jb = (int)(R - r0) * tw;
    const float* xc = x + ((long)n * g->c + c) * g->h * g->w;
    /* the tile row's input rows, zero-padded (row q holds input column q - pw) */
    for (int u = 0; u < {al}; u++) {{
      int iy = ty * {m} - g->ph + u;
      float* row = rb + u * pitch;
      if (iy < 0 || iy >= g->h) {{
        memset(row, 0, sizeof(float) * wp);
        continue;
      }}
      memset(row, 0, sizeof(float) * g->pw);
      memcpy(row + g->pw, xc + (long)iy * g->w, sizeof(float) * g->w);
      memset(row + g->pw + g->w, 0, sizeof(float) * (wp - g->pw - g->w));
    }}
    /* each tile element (u, v) into a run over the tiles, VW tiles per shuffle */
    for (int u = 0; u < {al}; u++)
      for (int ch = 0; ch < chunks; ch++) {{
        const float* s = rb + u * pitch + ch * {vw * m};
        float* p = P + u * {al} * pp + jb + ch * {vw};
{_gather(m, al)}
      }}
  }}
  /* columns past the block's last tile are zeros, so the products there stay finite */
  for (int e = 0; e < {al * al}; e++)
    for (int j = tiles; j < used; j++) P[e * pp + j] = 0.0f;
  for (int j = 0; j < used; j += {vw}) {{
    float* d = V + ((long)(j / nr) * g->c + c) * nr + j % nr;
{body_in}
  }}
}}

/* Output tiles of `rows` channels from k0 (products mb[xi][i][j], j a tile of the block) into Y, through the
   scratch O (m*m x tbp). */
__attribute__((noinline)) static void plait_wino_out_{f}(const float* Mb, int mr, int rows, long r0, long r1,
                                                         const plait_wino_geo* g, float* Y, int k0, float* O) {{
  int tw = g->tw, tbp = g->tbp, used = ((int)(r1 - r0) * tw + {vw - 1}) / {vw} * {vw};
  long ms = (long)mr * tbp + PLAIT_WINO_SKEW;
  for (int i = 0; i < rows; i++) {{
    const float* mb = Mb + (long)i * tbp;
    for (int j = 0; j < used; j += {vw}) {{
{body_out}
    }}
    for (long R = r0; R < r1; R++) {{
      int n = (int)(R / g->th), ty = (int)(R % g->th), jb = (int)(R - r0) * tw;
      float* yc = Y + ((long)n * g->k + k0 + i) * g->oh * g->ow;
      for (int r = 0; r < {m} && ty * {m} + r < g->oh; r++) {{
        float* yr = yc + (long)(ty * {m} + r) * g->ow;
        const float* o = O + r * {m} * tbp + jb;
        for (int tx = 0; tx < tw; tx++)
          for (int s = 0; s < {m} && tx * {m} + s < g->ow; s++) yr[tx * {m} + s] = o[s * tbp + tx];
      }}
    }}
  }}
}}
//@shared-end
"""


_GEO = """//@shared-begin plait_wino_geo
/* A Winograd convolution's geometry: channels in and out (kp: out rounded up to the register tile; ldu: the row
   stride of U), image, output,
   padding, tile rows and columns per image, tile rows per block and tile columns per block (padded to panels). */
typedef struct { int c, k, kp, ldu, us, h, w, oh, ow, ph, pw, th, tw, rpb, tbp; } plait_wino_geo;
/* Floats between consecutive tile elements xi of the transformed inputs V and of the products, past a whole number
   of panels: those strides are often a multiple of 4 KB (64 channels x 16 tiles x 4 bytes), which put all 36 stores
   of one input tile (and the output transform's 36 loads) into one L1 set; one line more spreads them over 36. */
enum { PLAIT_WINO_SKEW = 16 };
/* the gather's shuffle indices: one int per lane of plait_vf */
typedef int plait_wi __attribute__((vector_size(PLAIT_VW * 4)));
#if defined(__clang__)
#define PLAIT_WSHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define PLAIT_WSHUF(a, b, ...) __builtin_shuffle(a, b, (plait_wi){__VA_ARGS__})
#endif
//@shared-end
"""


def _driver(m: int, r: int, mr: int, nv: int) -> str:
    """Blocks of tile rows: per chunk of blocks, one parallel pass transforms the input tiles (one task per block and
    channel), a second runs the products, output transform and epilogue (one task per block and row tile)."""
    al2, nr, t, f = (m + r - 1) ** 2, nv * gemm_c.VW, f"{mr}x{nv}", _tag(m, r)

    def micro(tile: str, args: str) -> str:
        """A product of U's rows with a panel of V through the micro-kernel for `tile`: with U_PACKED its blocked
        mode (plait_microx_, apk 2), else the plain one reading U's rows ldu apart. `args`: from the panel on."""
        if U_PACKED:
            return f"plait_microx_{tile}(g->c, u, 0, {args}, 0, 0, 0, 0, 0, 2)"
        return f"plait_micro_{tile}(g->c, u, g->ldu, {args})"

    whole, tail = "used", ""
    if _tail(nv):
        whole = "cols - (used - 1) * " + f"{nr} <= {gemm_c.VW} ? used - 1 : used"
        tail = f"""
          if (whole < used) /* a last panel of at most VW tiles: the one-vector kernel on its first vector */
            {micro(f"{mr}x1of{nv}", f"vb + xi * xs + (long)whole * g->c * {nr}, mb + xi * ms + whole * {nr}, tbp, 1, {mr}, {gemm_c.VW}, 0")};"""
    return f"""//@shared-begin plait_wino_{f}_{t}
static void plait_wino_{f}_{t}(const plait_wino_geo* g, int images, const float* X, const float* U, float* Y,
                              plait_epi_fn epi, void* const* extra) {{
  long rows_all = (long)images * g->th;
  int rpb = g->rpb, tbp = g->tbp, panels = tbp / {nr}, groups = g->kp / {mr};
  long blocks = (rows_all + rpb - 1) / rpb, xs = (long)panels * g->c * {nr} + PLAIT_WINO_SKEW, vblock = {al2}L * xs;
  long chunk = {V_BUDGET}L / (vblock * (long)sizeof(float));
  if (chunk < 1) chunk = 1;
  if (chunk > blocks) chunk = blocks;
  float* V = plait_team_shared((size_t)(chunk * vblock)); /* a team step: the run's buffer */
  if (!V) {{ /* run alone: one thread's buffer, its address given to the whole team */
#pragma omp single copyprivate(V)
    V = plait_shared_scratch((size_t)(chunk * vblock));
  }}
  /* every thread of the team runs the chunk loop (its loops are orphaned worksharing: see plait/codegen/c.py) */
  for (long b0 = 0; b0 < blocks; b0 += chunk) {{
    long nb = blocks - b0 < chunk ? blocks - b0 : chunk;
    {{
      {gemm_c.steal_loop("t", "nb * g->c", "st_in")} {{
        long r0 = (b0 + t / g->c) * rpb, r1 = r0 + rpb < rows_all ? r0 + rpb : rows_all;
        plait_wino_in_{f}(X, g, r0, r1, (int)(t % g->c), V + t / g->c * vblock, {nr});
      }}
      plait_team_barrier(); /* every input tile is transformed before the products read them */
      {gemm_c.steal_loop("t", "nb * groups", "st_mm")} {{
        long r0 = (b0 + t / groups) * rpb, r1 = r0 + rpb < rows_all ? r0 + rpb : rows_all;
        int k0 = (int)(t % groups) * {mr}, rows = g->k - k0 < {mr} ? g->k - k0 : {mr};
        const float* vb = V + t / groups * vblock;
        long ms = (long){mr} * tbp + PLAIT_WINO_SKEW;
        float* mb = plait_scratch((size_t)({al2} * ms) + (size_t){m * m} * tbp);
        int cols = (int)((r1 - r0) * g->tw), used = (cols + {nr - 1}) / {nr}, whole = {whole};
        for (int xi = 0; xi < {al2}; xi++) {{
          const float* u = U + (long)xi * g->us + (long)k0 * g->ldu;
          /* the next element's rows of U (U_AHEAD) come in while these multiply */
          if (xi + {U_AHEAD} < {al2})
            for (long e = 0; e < (long){mr} * g->ldu; e += 16)
              __builtin_prefetch(u + {U_AHEAD}L * g->us + e, 0, {U_LOCALITY});
          for (int p = 0; p < whole; p++)
            {micro(t, f"vb + xi * xs + (long)p * g->c * {nr}, mb + xi * ms + p * {nr}, tbp, 1, {mr}, {nr}, 0")};{tail}
        }}
        plait_wino_out_{f}(mb, {mr}, rows, r0, r1, g, Y, k0, mb + {al2} * ms);
        /* the epilogue runs on each image's rows of finished output, a contiguous run of every channel plane */
        for (long R = r0; epi && R < r1;) {{
          long n = R / g->th, end = (n + 1) * g->th < r1 ? (n + 1) * g->th : r1;
          int y0 = (int)(R % g->th) * {m}, y1 = (int)((end - 1) % g->th + 1) * {m};
          if (y1 > g->oh) y1 = g->oh;
          epi(Y + n * g->k * g->oh * g->ow, n, k0, y0 * g->ow, rows, (y1 - y0) * g->ow, extra);
          R = end;
        }}
      }}
      if (b0 + chunk < blocks) plait_team_barrier(); /* the next chunk's input transform overwrites V */
    }}
  }}
}}
//@shared-end
"""


def _geo(p: WinogradPlan) -> str:
    fields = (p.c, p.k, p.kp, p.ldu, p.slab, p.h, p.w, p.oh, p.ow, p.ph, p.pw, p.th, p.tw, p.rpb, p.tbp)
    return ", ".join(map(str, fields))


def library(p: WinogradPlan) -> str:
    """The shared C code a Winograd kernel calls: the GEMM library (micro-kernel, scratch buffers), the tile
    transforms for F(m, r) and the driver for its register tile."""
    return gemm_c.library(p.mr, p.nv) + _GEO + _transforms(p.m, p.r) + _driver(p.m, p.r, p.mr, p.nv)


def _epilogue(p: WinogradPlan, r: Any, epi: Any) -> tuple[str, str, str, str, str]:
    """(function source, function name, extra-array argument, its declaration, kernel parameters) of the epilogue
    `epi` (a gemm.Epilogue) over output rows (channels) i0.. and columns (output positions) j0.. of image bz: the
    same row-pass the C GEMM runs on its finished tiles."""
    if epi is None:
        return "", "0", "0", "", ""
    n = p.oh * p.ow
    narrow = p.n * p.k * n < 2**31
    index = (
        f"(int)bz * {p.k * n} + (i0 + i) * {n} + j0 + j"
        if narrow
        else f"bz * {p.k * n}L + (long)(i0 + i) * {n} + j0 + j"
    )
    coords = gemm._tile_coords(epi.root.shape, p.n, p.k, n)
    stmts, res, params = gemm._epi(r, epi, "v", index, "      ", "int" if narrow else "long", coords)
    loads = "".join(
        f"  const {r.storage_type(x.dtype)}* restrict e{i} = extra[{i}];\n" for i, x in enumerate(epi.extra)
    )
    fn = f"""static void epi_KERNEL_NAME(float* restrict c, long bz, int i0, int j0, int mr, int nr, void* const* extra) {{
{loads}  for (int i = 0; i < mr; i++) {{
#pragma omp simd
    for (int j = 0; j < nr; j++) {{
      float v = c[(long)(i0 + i) * {n} + j0 + j];
{stmts}      c[(long)(i0 + i) * {n} + j0 + j] = {res};
    }}
  }}
}}
"""
    holder = f"  void* const extra[] = {{{', '.join(f'(void*)e{i}' for i in range(len(epi.extra))) or '0'}}};\n"
    return fn, "epi_KERNEL_NAME", "extra", holder, params


def render(p: WinogradPlan, r: Any, epi: Any = None) -> RenderedKernel:
    """The convolution kernel C = conv(B, U) (U the transformed weight) followed by `epi`, a gemm.Epilogue."""
    epi_src, epi_fn, extra, holder, params = _epilogue(p, r, epi)
    body = f"""{holder}  static const plait_wino_geo geo = {{{_geo(p)}}};
  plait_wino_{p.tag}_{p.mr}x{p.nv}(&geo, {p.n}, B, A, C, {epi_fn}, {extra});
"""
    args = ["float* restrict C", "const float* restrict A", "const float* restrict B", *params.split(", ")[1:]]
    src = entry_points("KERNEL_NAME", args, body, f"{library(p)}/* KERNEL_NAME */\n{epi_src}")
    return _named(f"WINO{p.m}_{p.n}x{p.k}x{p.oh * p.ow}x{p.c * p.r * p.r}", src)


def render_weight(p: WinogradPlan) -> RenderedKernel:
    """The weight transform U[xi] = (G w[k, c] G^T)[xi] (rows k >= K and, packed, channels c >= C zero), from the
    (K, C*r*r) weight view, laid out as the micro-kernel's blocked panels (U_PACKED) or as rows k of C channels. The
    channels run across the vector lanes, 64 at a time: their taps are first copied tap-major into a small buffer,
    so that each of U's alpha^2 elements is stored a vector of channels per instruction (gcc does not gather the
    channel-major taps itself). Per training step this kernel runs on every 3x3 weight; resnet18's 512x512 F(4,3)
    transform took 11 ms one channel at a time (docs/benchmarks.md, "cpu training step: layer4 by Winograd")."""
    _, g, _ = _matrices(p.m, p.r)
    al, r = p.alpha, p.r
    ao, sam, sak = p.w_view
    src = [[f"t[{u * r + v}][j]" for v in range(r)] for u in range(r)]
    lines, out = _sandwich(g, src, "u", "        ")
    gather = f"""        for (int j = 0; j < nc; j++) {{
          const float* w = W + {ao} + (long)k * {sam} + (long)(c0 + j) * {r * r * sak};
          for (int q = 0; q < {r * r}; q++) t[q][j] = w[q * {sak}];
        }}
"""
    if U_PACKED:
        # U as the micro-kernel's blocked panels (gemm_c: apk 2): row i of panel kb, channels c..c+VW (c a multiple of
        # VW) at kb * mr * ldu + c * mr + i * VW, so each vector of channels is one store, as in the plain layout
        mr, vw = p.mr, gemm_c.VW
        stores = [
            f"          U[{a * al + b}L * {p.slab} + base + l] = {out[a][b]};" for a in range(al) for b in range(al)
        ]
        lines_l = [ln.replace("][j]", "][jb + l]") for ln in lines]
        loop = f"""#pragma omp for schedule(static) nowait
  for (int kb = 0; kb < {p.kp // mr}; kb++)
    for (int c0 = 0; c0 < {p.c}; c0 += 64)
      for (int i = 0; i < {mr}; i++) {{
        const int k = kb * {mr} + i, nc = {p.c} - c0 < 64 ? {p.c} - c0 : 64;
        float t[{r * r}][64] = {{{{0}}}}; /* zeros: rows past the weight's and channels past c */
        if (k < {p.k})
{gather}        for (int jb = 0; jb < nc; jb += {vw}) {{
          const long base = (long)kb * {mr} * {p.ldu} + (long)(c0 + jb) * {mr} + i * {vw};
#pragma omp simd
          for (int l = 0; l < {vw}; l++) {{
{chr(10).join(lines_l)}
{chr(10).join(stores)}
          }}
        }}
      }}
"""
    else:
        stores = [
            f"        U[({a * al + b}L * {p.kp} + k) * {p.ldu} + c0 + j] = {out[a][b]};"
            for a in range(al)
            for b in range(al)
        ]
        body = "\n".join(lines + stores)
        zero = f"for (long i = 0; i < {p.c}; i++) U[((long)xi * {p.kp} + k) * {p.ldu} + i] = 0.0f;"
        loop = f"""#pragma omp for schedule(static) nowait
  for (int k = 0; k < {p.kp}; k++) {{
    if (k >= {p.k}) {{
      for (int xi = 0; xi < {al * al}; xi++) {zero}
      continue;
    }}
    for (int c0 = 0; c0 < {p.c}; c0 += 64) {{
      const int nc = {p.c} - c0 < 64 ? {p.c} - c0 : 64;
      float t[{r * r}][64];
{gather}#pragma omp simd
      for (int j = 0; j < nc; j++) {{
{body}
      }}
    }}
  }}
"""
    src_text = entry_points("KERNEL_NAME", ["float* restrict U", "const float* restrict W"], loop)
    return _named(f"WINOW{p.m}_{p.k}x{p.c}", src_text)


def _named(stem: str, src: str) -> RenderedKernel:
    name = f"{stem}_{hashlib.sha256(src.encode()).hexdigest()[:10]}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), (1,), None)
