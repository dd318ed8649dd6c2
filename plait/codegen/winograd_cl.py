"""Winograd F(2,3) convolution for OpenCL: 3x3, stride-1 convolutions as 16 products of 4x4-tile transforms.

F(2,3) computes a 2x2 output tile from a 4x4 input tile with 16 products per channel pair instead of 36 (2.25x
fewer multiply-adds). The work is four kernels, so the products run on the tuned OpenCL GEMM (the 3xTF32
tensor-core template on NVIDIA, its tile heuristic and `plait tune`) instead of a template of their own:

1. weight transform U[xi] = (G g G^T)[xi], 16 matrices (K, C); a plan runs it once when the weight is a constant;
2. input transform V[xi] = (B^T d B)[xi] of every 4x4 input tile d (padding read as zeros), 16 matrices (C, T) over
   the T = images x tile rows x tile columns tiles (T padded to a multiple of 4 for the GEMM's vector loads);
3. M[xi] = U[xi] V[xi]: one batched GEMM (batch 16, `gemm_spec`), rendered by gemm.render_opencl;
4. output transform Y = A^T M A per tile, followed by the convolution's fused epilogue (bias, batch norm, ReLU,
   residual add: a gemm.Epilogue, rendered as the GEMM templates render it) as each output is stored.

The transforms are memory-bound: V and M hold 16/4 = 4x the image and the output, so a layer wins only where the
product it saves outweighs that traffic, which grows as 1/C against the product's work. On an H100 (3xTF32
products) the 64-channel layers of resnet and vgg16 ran 0.82-0.90x the implicit GEMM's speed and every layer with
at least 128 channels in and out 1.16-2.00x, so `pick` keeps Winograd to those (docs/benchmarks.md, "NVIDIA GPU:
Winograd F(2,3) through OpenCL").

A training convolution's weight gradient runs the same algorithm backwards (`wgrad_plan`, `render_dy`,
`render_wgrad`): dW = G^T [sum over tiles of (A dy A^T) . V] G, the 16 products over the tiles on the same GEMM in K
chunks. Its V is the forward's input transform, which the forward then takes instead of making its own
(scheduler `_winograd_cl`).

5x5 stride-1 convolutions run the same kernels as F(2,5) (a plan's `r` = 5): 6x6 input tiles and 36 products per
2x2 outputs instead of 100, with V and M 9x the image and the output. A stride-1 5x5 layer's input gradient is a 5x5
stride-1 convolution of dy with the flipped weight (`nn.functional._conv_vjp`), so it takes the forward's path.

F(4, 3) (a plan's `m` = 4) runs 3x3 forwards and input gradients on the same kernels with 6x6 input tiles and 4x4
outputs: 36 products per 16 outputs instead of 144, V and M 2.25x the image and the output instead of F(2, 3)'s 4x,
so it also wins on 64-channel layers, where F(2, 3)'s traffic lost (`_auto43`). Its transforms' larger coefficients
round about ten times coarser than F(2, 3)'s (about 5e-6 of the largest output against float64 on the H100's 3xTF32
products, 2e-7 for F(2, 3)). Weight gradients that run Winograd take F(4, 3) where the forward does (`R43_WGRAD`),
and the two share V as F(2, 3)'s do.

F(4, 5) (`m` = 4, `r` = 5) runs 5x5 forwards, input gradients and weight gradients with 8x8 tiles, 64 products per
4x4 outputs; a training forward and its weight gradient share V the same way.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from plait import settings
from plait.codegen import gemm, winograd_c
from plait.codegen.cstyle import RenderedKernel
from plait.errors import PlaitError

ALPHA = 4  # input tile edge of F(2, 3); 2x2 outputs per tile (a plan's `alpha` is 2 + r - 1 for r x r taps)
# F(2, 5) for 5x5 taps: Cook-Toom points 0, 1, -1, 2, -2 and infinity, 6x6 input tiles, 36 products per 2x2 outputs
# instead of 100. B^T is F(4, 3)'s (the same points); G carries the 1 / prod(p_j - p_l) factors, so the input and
# output transforms stay in small integers. tests/unit/test_winograd_f25.py derives them again and checks
# A^T [(G g) . (B^T d)] against the direct correlation exactly.
F25: tuple[winograd_c._Mat, winograd_c._Mat, winograd_c._Mat] = (
    winograd_c.TRANSFORMS[4][0],
    winograd_c._mat(
        [
            ["1/4", 0, 0, 0, 0],
            ["-1/6", "-1/6", "-1/6", "-1/6", "-1/6"],
            ["-1/6", "1/6", "-1/6", "1/6", "-1/6"],
            ["1/24", "1/12", "1/6", "1/3", "2/3"],
            ["1/24", "-1/12", "1/6", "-1/3", "2/3"],
            [0, 0, 0, 0, 1],
        ]
    ),
    winograd_c._mat([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 1]]),
)
TRANSFORMS = {3: winograd_c.TRANSFORMS[2], 5: F25}  # (B^T, G, A^T) by filter size r
# F(4, 3) (a plan's `m` = 4): 4x4 outputs per 6x6 input tile, 36 products instead of 144, V and M 2.25x the image and
# the output (F(2, 3)'s are 4x); the matrices are the cpu's (points 0, +-1, +-2, infinity)
F43 = winograd_c.TRANSFORMS[4]
# F(4, 5) (a plan's `m` = 4 with r = 5): Cook-Toom points 0, 1, -1, 2, -2, 1/2, -1/2 and infinity, 8x8 input tiles, 64
# products per 4x4 outputs instead of 400: 0.44x F(2, 5)'s products and V and M (which hold 4x the image and the
# output instead of 9x). A^T evaluates at the points, G carries the Lagrange denominators (as F(2, 5)'s) and B^T
# solves the bilinear identity; tests/unit/test_winograd_f25.py derives all three again and checks them exactly.
F45: tuple[winograd_c._Mat, winograd_c._Mat, winograd_c._Mat] = (
    winograd_c._mat(
        [
            [-1, 0, "21/4", 0, "-21/4", 0, 1, 0],
            [0, 1, 1, "-17/4", "-17/4", 1, 1, 0],
            [0, -1, 1, "17/4", "-17/4", -1, 1, 0],
            [0, "1/2", "1/4", "-5/2", "-5/4", 2, 1, 0],
            [0, "-1/2", "1/4", "5/2", "-5/4", -2, 1, 0],
            [0, 2, 4, "-5/2", -5, "1/2", 1, 0],
            [0, -2, 4, "5/2", -5, "-1/2", 1, 0],
            [0, -1, 0, "21/4", 0, "-21/4", 0, 1],
        ]
    ),
    winograd_c._mat(
        [
            [-1, 0, 0, 0, 0],
            ["-2/9", "-2/9", "-2/9", "-2/9", "-2/9"],
            ["-2/9", "2/9", "-2/9", "2/9", "-2/9"],
            ["1/90", "1/45", "2/45", "4/45", "8/45"],
            ["1/90", "-1/45", "2/45", "-4/45", "8/45"],
            ["32/45", "16/45", "8/45", "4/45", "2/45"],
            ["32/45", "-16/45", "8/45", "-4/45", "2/45"],
            [0, 0, 0, 0, 1],
        ]
    ),
    winograd_c._mat(
        [
            [1, 1, 1, 1, 1, 1, 1, 0],
            [0, 1, -1, 2, -2, "1/2", "-1/2", 0],
            [0, 1, 1, 4, 4, "1/4", "1/4", 0],
            [0, 1, -1, 8, -8, "1/8", "-1/8", 1],
        ]
    ),
)
MIN_CHANNELS = 128  # 'auto': fewer input or output channels stay on the implicit GEMM (transform traffic ~ 1/C)
MIN_TILES = 1024  # 'auto': fewest tiles (images x tile rows x tile columns); resnet's 7x7 layers at batch 64 have 1024
# 'auto' at batch 1: 56x56 outputs and up, or 28x28 with 512 channels (vgg16's layers from 112x112 to 28x28: its b1
# replay 1.51 -> 1.34 ms with every eligible layer on an H100, 1.44 ms with the 784-tile rule alone, while resnet18/50's
# 28x28 and smaller layers, 128 to 256 channels at 28x28, ran no faster or slower: 0.52 -> 0.56, 1.10 -> 1.22 ms)
MIN_TILES_ONE_IMAGE = 784
MIN_TILES_ONE_IMAGE_WIDE = 196  # with at least WIDE channels in and out
WIDE = 512
# 'auto' for F(4, 3) (3x3 layers, forward and input gradient; weight gradients stay F(2, 3)): at least
# F43_MIN_CHANNELS channels in and out and F43_MIN_TILES tiles of 4x4 outputs, else F(2, 3)'s rule above. H100, 3xTF32
# products, direct / F(2, 3) / F(4, 3) kernel time (benchmarks/bench_winograd43_cl.py, docs/benchmarks.md "Winograd
# F(4,3)"): at batch 64 F(4, 3) won every layer of vgg16 and resnet, forward and input gradient, the 64-channel
# ones too (64 -> 64 at 224x224 6.37 / 7.60 / 5.06 ms, at 56x56 0.431 / 0.526 / 0.387; 512 -> 512 at 7x7, 256 tiles,
# 0.405 / 0.283 / 0.236); at batch 1 from 196 tiles (56x56: 256 -> 256 0.127 / 0.100 / 0.072 ms), while at 28x28
# (49 tiles) F(2, 3) won (512 -> 512 0.174 / 0.101 / 0.105, 256 -> 512 0.092 / 0.063 / 0.074)
F43_MIN_CHANNELS = 64
F43_MIN_TILES = 196
LOCAL = 128  # work-items per work-group of the transform kernels
# 'auto' for 5x5 layers: F(2, 5)'s V and M hold 9x the image and the output, so only layers with R5_MIN_CHANNELS
# channels in and out and R5_MIN_TILES tiles (alexnet's 64 -> 192 at 27x27 has 12544 at batch 64). H100, batch 64,
# that layer direct / F(2, 5) (benchmarks/bench_winograd5_cl.py, with the F(2, 5) product tiles): input gradient
# 0.75 / 0.57 ms, weight gradient 0.75 / 0.61, the training forward 0.72 / 0.66. The inference forward (unfolded,
# bias and ReLU in the output transform) takes it too: alexnet's b64 inference 2.10-2.12 -> 2.01-2.04 ms. At batch
# 1 (196 tiles) F(2, 5) gained nothing (0.25-0.26 ms both ways), which R5_MIN_TILES keeps direct
R5_AUTO = True
R5_MIN_CHANNELS = 64
R5_MIN_TILES = 4096
# 5x5 forwards and input gradients that 'auto' gives Winograd run as F(4, 5)
R45_AUTO = True
# ... and so do 5x5 weight gradients, with R45_WGRAD: dy's 4x4 tiles transformed to 8x8 (A dy A^T) and 64 products
# over a quarter of F(2, 5)'s tiles, whose V the F(4, 5) training forward then shares. Their K chunks aim for
# R45_WGRAD_TILE_TARGET 64x64 tiles in chunks of at least R45_WGRAD_MIN_CHUNK tile columns. H100, alexnet's layer at
# batch 64 (3136 tiles, 192 64x64 tiles per chunk; bench_winograd5_cl.py --sweep --sweep-mode 4): the product ran
# 0.150 ms in 2 chunks of 1568 columns, 0.151 in 4 of 800, 0.154 in 8 of 416, 0.164 in 12 of 288 (each at its best
# tiles), and 2 chunks pad V's columns (which the forward's product also runs over) least: 3136 against 3200-3456
R45_WGRAD = True
R45_WGRAD_TILE_TARGET = 384
R45_WGRAD_MIN_CHUNK = 512
# 3x3 weight gradients run as F(4, 3) where F(2, 3)'s weight-gradient rule gives Winograd and `_auto43` F(4, 3): 36
# products over a quarter of F(2, 3)'s tiles, V shared with the F(4, 3) training forward (their chunks follow F(2, 3)'s
# 64x64-tile rule). H100, batch 64 training step, F(2, 3) / F(4, 3) weight gradients, interleaved twice: vgg16 80.64,
# 80.86 / 72.93, 73.02 ms; resnet50 64.36, 65.86 / 65.15, 65.14 (its 128- to 512-channel layers at 28x28 to 7x7 lose
# the 128x128 tiles of WGRAD_WIDE_KNOBS); the bench's output check the same (rel_error 0.0667 and 0.0273 both ways)
R43_WGRAD = True
# ... and with R43_WGRAD, 64-channel ones (under F(2, 3)'s MIN_CHANNELS) from R43_WGRAD_NARROW_MIN_TILES 4x4-output
# tiles. H100, batch 64 training step, one pair with the rule at 1024 tiles against without (03:06-03:09 UTC):
# vgg16 (conv1_2, 64 -> 64 at 224x224: 200704 tiles) 73.37 -> 70.21 ms; resnet50 (64 -> 64 at 56x56: 12544) 63.83 ->
# 64.37, resnet18 19.19 ±0.51 -> 18.43 (18.34-18.58 without in the call before); the threshold lies between them
R43_WGRAD_NARROW_MIN_TILES = 50176


@dataclass(frozen=True)
class WinogradCLPlan:
    """One convolution's Winograd geometry: batch n, channels c in and k out, image h x w, output oh x ow, padding,
    the image view (offset, per-image stride) the input transform reads and the weight view (offset, row stride,
    tap stride) the weight transform reads."""

    n: int
    c: int
    k: int
    h: int
    w: int
    oh: int
    ow: int
    ph: int
    pw: int
    x_view: tuple[int, int]
    w_view: tuple[int, int, int]
    fold: bool = False  # the output is laid out (K, N, OH*OW), a training convolution's folded product
    pad: int = 4  # V's tile columns are padded to a multiple of this (float4 loads; whole K chunks for `wgrad_plan`)
    parts: int = 1  # K chunks of a weight gradient's alpha^2 products over the tiles (`wgrad_plan`)
    r: int = 3  # filter taps r x r: F(m, r) with alpha x alpha input tiles
    m: int = 2  # m x m outputs per tile: 2, or 4 (F(4, 3) and F(4, 5))

    @property
    def alpha(self) -> int:
        return self.m + self.r - 1

    @property
    def mats(self) -> tuple[winograd_c._Mat, winograd_c._Mat, winograd_c._Mat]:
        """(B^T, G, A^T) of F(m, r)."""
        if self.m == 4:
            return F45 if self.r == 5 else F43
        return TRANSFORMS[self.r]

    @property
    def xis(self) -> int:
        """The number of products (alpha^2), one per transformed tile position."""
        return self.alpha * self.alpha

    @property
    def th(self) -> int:
        return -(-self.oh // self.m)

    @property
    def tw(self) -> int:
        return -(-self.ow // self.m)

    @property
    def tiles(self) -> int:
        return self.n * self.th * self.tw

    @property
    def tp(self) -> int:
        """Tile columns of V and M: the tiles padded to a multiple of `pad` (float4 loads in the GEMM)."""
        return -(-self.tiles // self.pad) * self.pad

    @property
    def u_shape(self) -> tuple[int, int, int]:
        return (self.xis, self.k, self.c)

    @property
    def v_shape(self) -> tuple[int, int, int]:
        return (self.xis, self.c, self.tp)

    def gemm_spec(self) -> gemm.GemmSpec:
        """The alpha^2 products M[xi] (K, T) = U[xi] (K, C) @ V[xi] (C, T) as one batched GEMM."""
        k, c, tp = self.k, self.c, self.tp
        return gemm.GemmSpec(self.xis, k, tp, c, (0, k * c, c, 1), (0, c * tp, tp, 1))


def _mode(win: Any, k: int) -> str:
    """PLAIT_WINOGRAD_CL, checked; `win` and `k` (output channels) name the convolution in the error."""
    mode = str(settings.get("PLAIT_WINOGRAD_CL"))
    if mode not in ("off", "auto", "2", "4"):
        raise PlaitError(
            f"{win.kh}x{win.kw} convolution {win.n}x{win.c}x{win.h}x{win.w} -> {k} channels on OpenCL:"
            f" PLAIT_WINOGRAD_CL={mode!r} is not one of auto, off, 2, 4; unset it for the per-layer choice"
        )
    return mode


def pick(spec: Any) -> WinogradCLPlan | None:
    """A Winograd plan for the implicit-convolution GEMM `spec`, or None where the implicit GEMM runs it.

    PLAIT_WINOGRAD_CL: 'auto' (the default) 3x3 ones as F(4, 3) where `_auto43` says, else as F(2, 3) with at least
    MIN_CHANNELS input and output channels and MIN_TILES tiles (for one image: MIN_TILES_ONE_IMAGE, or
    MIN_TILES_ONE_IMAGE_WIDE with WIDE channels), and 5x5 ones where `_auto5` says, as F(4, 5) with R45_AUTO; 'off'
    never; '2' every eligible convolution as F(2, r); '4' every eligible one as F(4, r)."""
    fold = _folded(spec)
    r = fold or _taps(spec)
    if not r or (not fold and spec.inner not in (1, spec.batch)):
        return None
    win = spec.conv
    mode = _mode(win, spec.m)
    # the images are the outer batch dim (inner 1) or the inner one (inner = batch), each with its own stride; a
    # folded product's columns run over the images of one NCHW buffer
    image = (0, win.c * win.h * win.w) if fold else (spec.b[0], spec.b[1] if spec.inner == 1 else spec.b_inner)
    plan = WinogradCLPlan(
        win.n, win.c, spec.m, win.h, win.w, win.oh, win.ow, win.ph, win.pw, image, (spec.a[0], *spec.a[2:]), bool(fold)
    )
    plan = replace(plan, r=r) if r != 3 else plan
    if mode == "off":
        return None
    if r == 5:
        if not (mode in ("2", "4") or _auto5(win.c, spec.m, plan.tiles)):
            return None
        return replace(plan, m=4) if mode == "4" or (mode == "auto" and R45_AUTO) else plan
    f43 = replace(plan, m=4)
    if mode == "4" or (mode == "auto" and _auto43(win.c, spec.m, f43.tiles)):
        return f43
    wide = min(win.c, spec.m) >= WIDE
    fewest = MIN_TILES if win.n > 1 else MIN_TILES_ONE_IMAGE_WIDE if wide else MIN_TILES_ONE_IMAGE
    if mode == "auto" and (min(win.c, spec.m) < MIN_CHANNELS or plan.tiles < fewest):
        return None
    return plan


WGRAD_TILE_TARGET = 1056  # 64x64 tiles a weight gradient's 16 products aim for in K chunks (8 per SM of an H100)
WGRAD_MIN_CHUNK = 1024  # shortest K chunk (tile columns) of those products
WGRAD_CHUNK_UNIT = 32  # chunks hold whole BK 32 steps, so no K edge is checked
# Where K and C are whole 128-row tiles, the products run in 128x128 tiles (WGRAD_WIDE_KNOBS) in the fewest K chunks
# that make WGRAD_WIDE_TARGET of them. H100, batch 64 (bench_wgrad_winograd_cl.py --sweep): 47-50 TFLOP/s from 256
# such tiles (512x512 at 28x28 in 1, 2 and 4 chunks 2.17, 2.14, 2.14 ms; 256x256 at 56x56 in 4 chunks 2.12; 512x512
# at 14x14 in one 0.56) against 36-38 in the 64x64 tiles the generic weight-gradient rule gives (2.73-2.82, 2.80,
# 0.71); with 128 such tiles they reached 44 (32x64 warps, KS 2), with 64 the 64x64 tiles won. Their chunks hold at
# least WGRAD_WIDE_MIN_CHUNK tile columns, 512x512 at 14x14 in one chunk (its 4 chunks of 800 also won, 0.59 against
# 0.70 ms): resnet's 512-channel 7x7 layers (one chunk of 1024) keep 64x64 tiles, as their one step A/B did not show
# a gain (resnet18 b64 21.41 -> 21.81 ms, in its noise).
WGRAD_WIDE_TARGET = 256
WGRAD_WIDE_MIN_CHUNK = 3136
WGRAD_WIDE_KNOBS = {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64}
# 64x64 tiles, BK 32, two warps splitting K: the sweeps below found it best for four kinds of Winograd product, each
# named for its own rule
SMALL_KS2_KNOBS = {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "KS": 2}
# 64 input channels (vgg16's conv2_1, 64 -> 128 at 112x112, batch 64: 33, 66 and 132 chunks of 6112, 3072 and 1536
# columns): the generic rule's 64x64 tiles with BK 32 ran 1.378, 1.369 and 1.360 ms, the same with KS 2 1.338, 1.319
# and 1.316, the fastest of the sweep's tiles in each (128x64 ones 1.385-1.729, 128x128 ones 1.99-2.28); taken where
# they make WGRAD_TILE_TARGET 64x64 tiles or more, as there (1056 to 4224); fewer were not swept
WGRAD_NARROW_KNOBS = SMALL_KS2_KNOBS
# 'auto': a weight gradient runs Winograd with at least MIN_CHANNELS output channels and WGRAD_MIN_IN input ones.
# H100, batch 64, direct / Winograd (benchmarks/bench_wgrad_winograd_cl.py): 1.21-1.73x for every layer of 128+
# channels in and out (7x7 to 112x112), 1.15-1.17x for vgg16's 64 -> 128 at 112x112, 0.82x and 0.97-0.99x for
# 64 -> 64 at 56x56 and 224x224 (the transforms of x and dy cost as much as the products they save)
WGRAD_MIN_IN = 64
# Under MIN_CHANNELS input channels a weight gradient also needs WGRAD_MIN_TILES_NARROW tiles. H100, batch 64, direct /
# Winograd (bench_wgrad_winograd_cl.py, each kernel alone): 64 -> 128 at 8x8 (1024 tiles, cifar_cnn) 0.054 / 0.058 ms
# (0.94x), at 16x16 (4096) 0.108 / 0.101 (1.07x); with 128+ channels in and out 1024 tiles won (128 -> 128 at 8x8
# 1.13x, 256 -> 256 and 512 -> 512 at 7x7 1.14x and 1.21x), and cifar_cnn's and resnet18's steps ran the same with
# their 1024-tile layers direct (2.327 / 2.332 ms, 22.88 / 22.75)
WGRAD_MIN_TILES_NARROW = 4096
# F(2, 5)'s 36 products aim for more tiles: H100, alexnet's 64 -> 192 layer at batch 64 (12544 tiles, 108 64x64
# tiles per chunk; benchmarks/bench_winograd5_cl.py --sweep --parts 10 4 2 1 6 12), the heuristic's tiles: 12 chunks
# of 1056 columns 0.316 ms, 6 of 2112 0.320, 10 of 1280 (WGRAD_TILE_TARGET's 1080 tiles) 0.338, 4 0.389, 2 0.407,
# 1 0.504; 12 chunks also pad V's columns to 12672 instead of 12800, which the forward's product runs on
R5_WGRAD_TILE_TARGET = 1296


def wgrad_plan(win: Any, k: int) -> WinogradCLPlan | None:
    """A Winograd plan for the weight gradient of the 3x3 stride-1 convolution `win` with `k` output channels (the
    caller checks groups == 1), or None where the direct product (dy @ columns^T) runs it.

    dW = G^T [sum over tiles of (A dy A^T) . (B^T d B)] G: the input tile d takes the forward's transform V, the
    output gradient's 2x2 tile the 4x4 transform A dy A^T (`render_dy`), the 16 products (K x C, the reduction
    over the tiles) run on the GEMM in `parts` K chunks, and `render_wgrad` sums the chunks and applies G^T . G.
    That is 16 multiplies per channel pair and 2x2 outputs where the direct product does 36. PLAIT_WINOGRAD_CL
    decides as for the forward: 'auto' with MIN_CHANNELS output and WGRAD_MIN_IN input channels and MIN_TILES
    tiles (WGRAD_MIN_TILES_NARROW under MIN_CHANNELS input channels), 'off' never, '2' always as F(2, r), '4'
    always as F(4, r). Under 'auto' 5x5 ones run as F(4, 5) with R45_WGRAD, 3x3 ones as F(4, 3) with R43_WGRAD
    where `_auto43` says (also 64-channel ones with R43_WGRAD_NARROW_MIN_TILES 4x4 tiles), else as F(2, r)."""
    r = _square(win)
    if not r:
        return None
    mode = _mode(win, k)
    base = WinogradCLPlan(
        win.n, win.c, k, win.h, win.w, win.oh, win.ow, win.ph, win.pw, (0, win.c * win.h * win.w), (0, 0, 1)
    )
    base = replace(base, r=r) if r != 3 else base
    narrow = k < MIN_CHANNELS or win.c < WGRAD_MIN_IN
    fewest = MIN_TILES if win.c >= MIN_CHANNELS else WGRAD_MIN_TILES_NARROW
    f43_narrow = mode == "auto" and r == 3 and R43_WGRAD and min(win.c, k) >= F43_MIN_CHANNELS
    f43_narrow = f43_narrow and replace(base, m=4).tiles >= R43_WGRAD_NARROW_MIN_TILES
    if mode == "off" or (mode == "auto" and not f43_narrow and (narrow or base.tiles < fewest)):
        return None
    if r == 5 and mode == "auto" and not _auto5(win.c, k, base.tiles):
        return None
    auto4 = R45_WGRAD if r == 5 else R43_WGRAD and _auto43(win.c, k, replace(base, m=4).tiles)
    if mode == "4" or (mode == "auto" and auto4):
        base = replace(base, m=4)
    wide = base.xis * (k // 128) * (win.c // 128) if k % 128 == 0 and win.c % 128 == 0 and base.m == 2 else 0
    parts = _wgrad_parts(base.tiles, wide, WGRAD_WIDE_TARGET, WGRAD_WIDE_MIN_CHUNK) if wide else 0
    if parts * wide < WGRAD_WIDE_TARGET or _chunk(base.tiles, max(parts, 1)) < WGRAD_WIDE_MIN_CHUNK:
        # too few 128x128 tiles or too short chunks: 64x64 ones (the generic weight-gradient rule)
        target, shortest = (
            (R45_WGRAD_TILE_TARGET, R45_WGRAD_MIN_CHUNK)
            if base.m == 4 and r == 5
            else (WGRAD_TILE_TARGET if r == 3 else R5_WGRAD_TILE_TARGET, WGRAD_MIN_CHUNK)
        )
        parts = _wgrad_parts(base.tiles, base.xis * -(-k // 64) * -(-win.c // 64), target, shortest)
    return replace(base, pad=WGRAD_CHUNK_UNIT * parts, parts=parts)


def _wgrad_parts(tiles: int, per_chunk: int, target: int, shortest: int = WGRAD_MIN_CHUNK) -> int:
    """The fewest K chunks (of whole WGRAD_CHUNK_UNIT steps, each at least `shortest` long) over `tiles` tile
    columns that make `target` GEMM tiles from `per_chunk` per chunk, else the most such chunks (at least one)."""
    parts = 1
    while parts * per_chunk < target and _chunk(tiles, parts + 1) >= shortest:
        parts += 1
    return parts


def wgrad_knobs(spec: gemm.GemmSpec) -> dict[str, int] | None:
    """Tiles for the batched product of a Winograd weight gradient (`winograd_cl_wgrad`'s D[xi] @ V[xi]^T in K
    chunks, as the scheduler lays it out: both operands (16, rows, tile columns), the chunks along the tile columns):
    WGRAD_WIDE_KNOBS where its rows and columns are whole 128-row tiles and make WGRAD_WIDE_TARGET of them in chunks
    of at least WGRAD_WIDE_MIN_CHUNK, WGRAD_NARROW_KNOBS for whole 128 rows by 64 columns (64 input channels) in
    WGRAD_TILE_TARGET 64x64 tiles or more, else None (the generic tile rule). The tensor-core tile heuristic asks
    this first, so `wgrad_plan`'s chunk count and these tiles go together."""
    if spec.batch % (ALPHA * ALPHA) or spec.m % 128 or not _wgrad_layout(spec):
        return None
    if spec.n == 64:
        return dict(WGRAD_NARROW_KNOBS) if spec.batch * (spec.m // 64) >= WGRAD_TILE_TARGET else None
    if spec.n % 128 or spec.k < WGRAD_WIDE_MIN_CHUNK:
        return None
    if spec.batch * (spec.m // 128) * (spec.n // 128) < WGRAD_WIDE_TARGET:
        return None
    return dict(WGRAD_WIDE_KNOBS)


def _wgrad_layout(spec: gemm.GemmSpec) -> bool:
    """Whether `spec` reads its operands as `winograd_cl_wgrad`'s product: 16 x parts products, the chunk s of the
    product xi at xi's (rows, tile columns) plane plus s chunks along the columns, A along K, B transposed."""
    if spec.conv is not None or spec.conv_t is not None or spec.a_nchw is not None:
        return False
    parts = spec.batch // (ALPHA * ALPHA)
    tp = spec.k * parts
    if (spec.a[2], spec.a[3], spec.b[2], spec.b[3]) != (tp, 1, 1, tp):
        return False
    a_plane, b_plane = spec.m * tp, spec.n * tp  # one xi's D and V
    for xi, s in ((0, 0), (0, parts - 1), (1, 0), (ALPHA * ALPHA - 1, parts - 1)):
        bz = xi * parts + s
        if spec.a_at(bz) != xi * a_plane + s * spec.k or spec.b_at(bz) != xi * b_plane + s * spec.k:
            return False
    return True


# Tiles for F(2, 5)'s 36 products M[xi] = U[xi] V[xi] (the forward, and the input gradient that takes its path),
# asked by the tensor-core tile heuristic before its generic rules. H100, alexnet's 64 -> 192 layer at batch 64
# (benchmarks/bench_winograd5_cl.py --sweep): the forward's 36x192x12800x64 ran 0.426 ms in 64x64 tiles with BK 32
# and KS 2 against 0.509 in the 64x128 ones the row-padding rule gives (0.456 without KS 2), the input gradient's
# 36x64x12544x192 0.316 in 64x128 tiles with KS 2 against 0.352 in the 64x64 BK 32 ones of the 64-row rule. Products
# whose rows are whole 128-row tiles were not swept and keep the generic rule.
R5_PRODUCT_MIN_COLUMNS = 1024
R5_RAGGED_KNOBS = SMALL_KS2_KNOBS  # rows pad 128-row tiles
R5_NARROW_KNOBS = {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2}  # 64 rows
# F(4, 5)'s 64 products with 64 rows or rows that 128-row tiles pad. H100, alexnet's layer at batch 64
# (bench_winograd5_cl.py --sweep --sweep-mode 4): the forward's 64x192x3136x64 ran 0.197 ms in these tiles against
# 0.239 in the generic rule's 64x128 ones, the input gradient's 64x64x3136x192 0.157 against 0.163 (no KS 2)
R45_KNOBS = SMALL_KS2_KNOBS
# F(4, 3)'s 36 products have the same layout. H100, batch 64, 3xTF32 (bench_winograd43_cl.py --sweep, docs/benchmarks.md
# "F(4,3) follow-ups"): 64 rows over K 64 (64 -> 64 layers; vgg16's conv1_2 36x64x200704x64, resnet's 36x64x12544x64)
# ran 2.140 / 0.148 ms in 64x64 tiles with BK 32 and KS 2 against 2.427 / 0.169 in R5_NARROW_KNOBS, which stay best for
# alexnet's K 192; whole 128-row tiles over K <= 256 that make under F43_FEW_TILES 128x128 tiles (resnet b64's 128 at
# 28x28, 36x128x3136x128: 900 tiles; 256 at 14x14, 36x256x1024x256: 576) 0.127 / 0.141 ms in 128x64 tiles against
# 0.149 / 0.157 in the generic rule's eight-warp 128x128 ones; deeper K (512 at 14x14: 0.480 generic) and more tiles
# (vgg16's, resnet's 256 at 56x56) keep the generic rule, which led there. Batch 1 (under F43_NARROW_MIN_COLUMNS or
# R5_PRODUCT_MIN_COLUMNS columns) was not swept and keeps the rules above.
F43_NARROW_KNOBS = SMALL_KS2_KNOBS
F43_NARROW_MIN_COLUMNS = 12544
F43_FEW_TILES = 1024
F43_FEW_KNOBS = {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32}


def product_knobs(spec: gemm.GemmSpec) -> dict[str, int] | None:
    """Tiles for the batched product of an F(2, 5) or F(4, 3) convolution (`WinogradCLPlan.gemm_spec` with 36
    products: U (36, K, C) and V (36, C, T) contiguous, at least R5_PRODUCT_MIN_COLUMNS tile columns): for 64 rows
    F43_NARROW_KNOBS over K 64 and F43_NARROW_MIN_COLUMNS columns, else R5_NARROW_KNOBS; R5_RAGGED_KNOBS for rows that
    128-row tiles pad; F43_FEW_KNOBS for K <= 256 and under F43_FEW_TILES 128x128 tiles; F(4, 5)'s 64 products
    R45_KNOBS for 64 rows or rows that 128-row tiles pad; else None (the generic tile rule)."""
    xis = spec.batch
    if xis not in ((2 + 5 - 1) ** 2, (4 + 5 - 1) ** 2) or spec.inner != 1 or spec.n < R5_PRODUCT_MIN_COLUMNS:
        return None
    if spec.n % 4:
        return None
    if spec.conv is not None or spec.conv_t is not None or spec.a_nchw is not None:
        return None
    m, n, k = spec.m, spec.n, spec.k
    if spec.a != (0, m * k, k, 1) or spec.b != (0, k * n, n, 1):
        return None
    if xis == (4 + 5 - 1) ** 2:
        return dict(R45_KNOBS) if m == 64 or m % 128 else None
    if m == 64:
        return dict(F43_NARROW_KNOBS if k == 64 and n >= F43_NARROW_MIN_COLUMNS else R5_NARROW_KNOBS)
    if m % 128:
        return dict(R5_RAGGED_KNOBS)
    return dict(F43_FEW_KNOBS) if k <= 256 and spec.batch * (m // 128) * -(-n // 128) < F43_FEW_TILES else None


def _chunk(tiles: int, parts: int) -> int:
    """The length of each of `parts` K chunks over `tiles` columns, rounded up to whole WGRAD_CHUNK_UNIT steps."""
    return -(-tiles // (parts * WGRAD_CHUNK_UNIT)) * WGRAD_CHUNK_UNIT


def _auto5(c: int, k: int, tiles: int) -> bool:
    """'auto' for a 5x5 layer (F(2, 5)): at least R5_MIN_CHANNELS input and output channels and R5_MIN_TILES tiles."""
    return R5_AUTO and min(c, k) >= R5_MIN_CHANNELS and tiles >= R5_MIN_TILES


def _auto43(c: int, k: int, tiles: int) -> bool:
    """'auto' for F(4, 3) on a 3x3 layer: at least F43_MIN_CHANNELS input and output channels and F43_MIN_TILES of
    its 4x4-output tiles."""
    return min(c, k) >= F43_MIN_CHANNELS and tiles >= F43_MIN_TILES


def _square(win: Any) -> int:
    """The filter size r of a stride-1, undilated convolution with r x r taps that F(2, r) exists for (3 or 5) and
    padding below r, else 0."""
    r = win.kh
    if win.kw != r or r not in TRANSFORMS or (win.sh, win.sw, win.dh, win.dw) != (1, 1, 1, 1):
        return 0
    return r if win.ph <= r - 1 and win.pw <= r - 1 else 0


def _taps(spec: Any) -> int:
    """The filter size r when `spec` (a GemmSpec) is an implicit-GEMM convolution Winograd can run per image (as
    winograd_c.eligible says for 3x3: one group, a weight shared by every image and read as (K, C*r*r) rows), else 0."""
    win = spec.conv
    r = _square(win) if win is not None and not win.fold else 0
    _, sab, sam, sak = spec.a
    ok = spec.batch == win.n and spec.n == win.oh * win.ow and spec.k == win.c * r * r if r else False
    return r if ok and sab == 0 and spec.a_inner == 0 and sak == 1 and sam >= spec.k else 0


def _folded(spec: Any) -> int:
    """The filter size r for the forward of a training convolution that Winograd can run with the batch folded into
    the columns (`Window.fold`: one product, the weight times every image's patch columns, out as (K, N, OH*OW)):
    3x3 or 5x5 taps, stride 1, no dilation, one group, the weight read as (K, C*r*r) rows, the images gathered from
    one buffer; else 0."""
    win = spec.conv
    r = _square(win) if win is not None and win.fold else 0
    _, _, sam, sak = spec.a
    ok = spec.batch == 1 and spec.n == win.n * win.oh * win.ow and spec.k == win.c * r * r if r else False
    return r if ok and sak == 1 and sam >= spec.k and spec.b == (0, 0, 0, 0) else 0


def _idx(*sizes: int) -> str:
    """The C index type for offsets up to the largest of `sizes` elements."""
    return "long" if max(sizes) >= 2**31 else "int"


def _named(stem: str, src: str, gs: tuple[int, ...], ls: tuple[int, ...]) -> RenderedKernel:
    name = f"{stem}_{hashlib.sha256(src.encode()).hexdigest()[:10]}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), gs, ls)


def _sandwich(mat: winograd_c._Mat, src: list[list[str]], tmp: str) -> tuple[str, list[list[str]]]:
    lines, out = winograd_c._sandwich(mat, src, tmp, "  ")
    return "\n".join(lines) + "\n", out


def _stem(base: str, p: WinogradCLPlan) -> str:
    """A kernel's name stem: F(2, 3)'s as it always was, F(2, 5)'s with an R5 suffix, F(4, 3)'s and F(4, 5)'s with
    their 2 (the output tile edge) made 4."""
    stem = base.replace("2", str(p.m), 1)
    return stem if p.r == 3 else f"{stem}R5"


def _grid(cols: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (-(-cols // LOCAL) * LOCAL,), (LOCAL,)


def render_weight(p: WinogradCLPlan) -> RenderedKernel:
    """U[xi][k][c] = (G w[k, c] G^T)[xi], one work-item per (k, c) from the (K, C*9) weight view."""
    _, g, _ = p.mats
    ao, sam, sak, r, al = *p.w_view, p.r, p.alpha
    it = _idx(p.k * p.c * p.xis, ao + p.k * sam)
    src = [[f"w[{(u * r + v) * sak}]" for v in range(r)] for u in range(r)]
    body, out = _sandwich(g, src, "u")
    stores = "".join(
        f"  U[{a * al + b} * {p.k * p.c}{'L' if it == 'long' else ''} + q] = {out[a][b]};\n"
        for a in range(al)
        for b in range(al)
    )
    src_text = f"""__kernel void KERNEL_NAME(__global float* restrict U, __global const float* restrict W) {{
  const {it} q = get_global_id(0);
  if (q >= {p.k * p.c}) return;
  const {it} k = q / {p.c}, c = q % {p.c};
  __global const float* w = W + {ao} + k * {sam} + c * {r * r * sak};
{body}{stores}}}
"""
    return _named(f"{_stem('WINOW2', p)}_{p.k}x{p.c}", src_text, *_grid(p.k * p.c))


def render_input(p: WinogradCLPlan) -> RenderedKernel:
    """V[xi][c][t] = (B^T d B)[xi] of the 4x4 input tile d of tile t in channel c (zeros outside the image and for
    the padding columns t >= T), one work-item per (t, c): neighbouring work-items write neighbouring columns."""
    bt, _, _ = p.mats
    xo, xs, al = *p.x_view, p.alpha
    it = _idx(p.xis * p.c * p.tp, xo + p.n * xs)
    per = p.th * p.tw
    loads = "".join(
        f"  const float d{u}_{v} = (t < {p.tiles} && (uint)(y0 + {u}) < {p.h}u && (uint)(x0 + {v}) < {p.w}u)"
        f" ? X[o + (y0 + {u}) * {p.w} + x0 + {v}] : 0.0f;\n"
        for u in range(al)
        for v in range(al)
    )
    body, out = _sandwich(bt, [[f"d{u}_{v}" for v in range(al)] for u in range(al)], "v")
    plane = f"{p.c * p.tp}{'L' if it == 'long' else ''}"
    stores = "".join(
        f"  V[{a * al + b} * {plane} + c * {p.tp} + t] = {out[a][b]};\n" for a in range(al) for b in range(al)
    )
    src_text = f"""__kernel void KERNEL_NAME(__global float* restrict V, __global const float* restrict X) {{
  const {it} t = get_global_id(0), c = get_global_id(1);
  if (t >= {p.tp}) return;
  const {it} img = t / {per}, r = t % {per};
  const int y0 = (int)(r / {p.tw}) * {p.m} - {p.ph}, x0 = (int)(r % {p.tw}) * {p.m} - {p.pw};
  /* (y0, x0): the tile's top-left corner, possibly outside the image; only in-image elements are read */
  const {it} o = {xo} + img * {xs} + c * {p.h * p.w};
{loads}{body}{stores}}}
"""
    gs, ls = _grid(p.tp)
    return _named(f"{_stem('WINOIN2', p)}_{p.n}x{p.c}x{p.h}x{p.w}", src_text, (gs[0], p.c), (ls[0], 1))


def render(p: WinogradCLPlan, r: Any, epi: gemm.Epilogue | None = None) -> RenderedKernel:
    """The output transform Y = A^T M A of each tile t and output channel gm from the 16 products M (16, K, T),
    then `epi` on each of the tile's 2x2 outputs inside the image, stored in NCHW order ((K, N, OH*OW) with
    `fold`)."""
    _, _, at = p.mats
    plane, positions, al, mo = p.k * p.tp, p.oh * p.ow, p.alpha, p.m
    shift = mo.bit_length() - 1  # the output tile's edge is a power of two
    it = _idx(p.xis * plane, p.n * p.k * positions)
    lit = "L" if it == "long" else ""
    loads = "".join(
        f"  const float m{u}_{v} = M[{u * al + v} * {plane}{lit} + mo];\n" for u in range(al) for v in range(al)
    )
    body, out = _sandwich(at, [[f"m{u}_{v}" for v in range(al)] for u in range(al)], "o")
    index = f"(gm * {p.n} + bz) * {positions}{lit} + gp" if p.fold else f"(bz * {p.k} + gm) * {positions}{lit} + gp"
    coords = gemm._tile_coords(epi.root.shape, p.n, p.k, positions, "gm", "gp") if epi and not p.fold else None
    stmts, res, params = gemm._epi(r, epi, "v", index, "      ", it, coords)
    src_text = f"""__kernel void KERNEL_NAME(__global float* restrict Y, __global const float* restrict M{params}) {{
  const {it} t = get_global_id(0), gm = get_global_id(1);
  if (t >= {p.tiles}) return;
  const {it} bz = t / {p.th * p.tw}, r = t % {p.th * p.tw}, mo = gm * {p.tp} + t;
  const int oy = (int)(r / {p.tw}) * {mo}, ox = (int)(r % {p.tw}) * {mo};
{loads}{body}  const float ys[{mo * mo}] = {{{", ".join(out[a][b] for a in range(mo) for b in range(mo))}}};
  for (int q = 0; q < {mo * mo}; q++) {{
    if (oy + (q >> {shift}) < {p.oh} && ox + (q & {mo - 1}) < {p.ow}) {{
      const {it} gp = (oy + (q >> {shift})) * {p.ow} + ox + (q & {mo - 1});
      const float v = ys[q];
{stmts}      Y[{index}] = {res};
    }}
  }}
}}
"""
    gs, ls = _grid(p.tiles)
    stem = _stem("WINOOUT2F" if p.fold else "WINOOUT2", p)
    return _named(f"{stem}_{p.n}x{p.k}x{positions}x{p.c * p.r * p.r}", src_text, (gs[0], p.k), (ls[0], 1))


def _transposed(mat: winograd_c._Mat) -> winograd_c._Mat:
    """mat^T: the backward transforms are the forward's transposed (A for dy's tiles, G^T for the taps)."""
    return tuple(zip(*mat, strict=True))


def render_dy(p: WinogradCLPlan) -> RenderedKernel:
    """D[xi][k][t] = (A g A^T)[xi] of the 2x2 output-gradient tile g of tile t in channel k (the (N, K, OH, OW)
    gradient; zeros outside the output and for the padding columns t >= T), one work-item per (t, k)."""
    _, _, at = p.mats
    positions, al = p.oh * p.ow, p.alpha
    it = _idx(p.xis * p.k * p.tp, p.n * p.k * positions)
    loads = "".join(
        f"  const float g{u}_{v} = (t < {p.tiles} && oy + {u} < {p.oh} && ox + {v} < {p.ow})"
        f" ? G[o + (oy + {u}) * {p.ow} + ox + {v}] : 0.0f;\n"
        for u in range(p.m)
        for v in range(p.m)
    )
    body, out = _sandwich(_transposed(at), [[f"g{u}_{v}" for v in range(p.m)] for u in range(p.m)], "d")
    plane = f"{p.k * p.tp}{'L' if it == 'long' else ''}"
    stores = "".join(
        f"  D[{a * al + b} * {plane} + k * {p.tp} + t] = {out[a][b]};\n" for a in range(al) for b in range(al)
    )
    src_text = f"""__kernel void KERNEL_NAME(__global float* restrict D, __global const float* restrict G) {{
  const {it} t = get_global_id(0), k = get_global_id(1);
  if (t >= {p.tp}) return;
  const {it} img = t / {p.th * p.tw}, r = t % {p.th * p.tw};
  const int oy = (int)(r / {p.tw}) * {p.m}, ox = (int)(r % {p.tw}) * {p.m};
  const {it} o = img * {p.k * positions} + k * {positions};
{loads}{body}{stores}}}
"""
    gs, ls = _grid(p.tp)
    return _named(f"{_stem('WINODY2', p)}_{p.n}x{p.k}x{p.oh}x{p.ow}", src_text, (gs[0], p.k), (ls[0], 1))


def render_wgrad(p: WinogradCLPlan) -> RenderedKernel:
    """dW[k][c] = G^T M G of the 16 products M[xi][k][c], each the sum of its `parts` K chunks in chunk order (the
    partial products laid out (16, parts, K, C)), stored as the (K, C, 3, 3) weight gradient; one work-item per
    (k, c)."""
    _, g, _ = p.mats
    kc, r, al = p.k * p.c, p.r, p.alpha
    it = _idx(p.xis * p.parts * kc, r * r * kc)
    lit = "L" if it == "long" else ""
    names = [[f"m{u}_{v}" for v in range(al)] for u in range(al)]
    zeros = "".join(f"  float {names[u][v]} = 0.0f;\n" for u in range(al) for v in range(al))
    sums = "".join(
        f"    {names[u][v]} += P[({(u * al + v) * p.parts} + s) * {kc}{lit} + q];\n"
        for u in range(al)
        for v in range(al)
    )
    body, out = _sandwich(_transposed(g), names, "w")
    stores = "".join(f"  W[q * {r * r} + {a * r + b}] = {out[a][b]};\n" for a in range(r) for b in range(r))
    src_text = f"""__kernel void KERNEL_NAME(__global float* restrict W, __global const float* restrict P) {{
  const {it} q = get_global_id(0);
  if (q >= {kc}) return;
{zeros}  for (int s = 0; s < {p.parts}; s++) {{
{sums}  }}
{body}{stores}}}
"""
    return _named(f"{_stem('WINOWG2', p)}_{p.k}x{p.c}x{p.parts}", src_text, *_grid(kc))
