"""The lanes form of the cpu's direct stem convolution (gemm_c.plait_conv_dlanes_*: output channels across the
vector lanes, 5-7 output pixels of a row per register tile, the tile written to NCHW by VW x VW transposes), taken
for blocks of DIRECT_LANES_CV * VW channels over at least gemm_c.DIRECT_LANES_MIN_K patch elements (alexnet's and
resnet's stems).
Checked against PyTorch on strides 1-4, padding, dilation, rows of 8-41 pixels (partial transposes, whole ones and
a padded last pixel group), 64 and 128 channels, batches and groups, and with the weights as plan inputs."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c
from tests.helpers import assert_close, rand

# pixels per tile: (with 16-float vectors, with 8 or 4: gemm_c.DIRECT_LANES_PX)
CASES = [  # n, cin, h, w, cout, kernel, stride, padding, dilation, groups, pixels per tile
    (1, 3, 43, 47, 64, 11, 4, 2, 1, 1, (6, 6)),  # alexnet's stem, small: 11-wide rows, 11 rows (two tasks)
    (2, 3, 37, 45, 64, 7, 2, 3, 1, 1, (6, 6)),  # resnet's 7x7/2 over 23-wide rows, two images
    (1, 3, 81, 81, 64, 5, 2, 2, 1, 1, (7, 6)),  # 41-wide rows: whole VW-pixel transposes and a partial one
    (1, 1, 25, 27, 128, 9, 1, 4, 2, 1, (5, 5)),  # stride 1, dilation 2, one input channel, several channel blocks
    (2, 4, 20, 23, 64, 5, 3, 2, 1, 1, (5, 5)),  # stride 3 (three column phases), 8-wide rows padded to 10 pixels
    (1, 4, 18, 18, 128, 7, 1, 3, 1, 2, (6, 6)),  # two groups of 2 input channels and 64 output channels each
]


def _tile(px: tuple[int, int]) -> str:
    """The lanes driver's name for this width's tile of the case."""
    return f"plait_conv_dlanes_{gemm_c.DIRECT_LANES_CV}x{px[0] if gemm_c.VW == 16 else px[1]}("


@pytest.mark.parametrize("case", CASES)
def test_lanes_convolution_matches_torch(case):
    n, cin, h, w, cout, k, s, p, d, groups, px = case
    x = rand((n, cin, h, w), low=-1, high=1)
    wt, b = rand((cout, cin // groups, k, k), seed=1, low=-1, high=1) * 0.2, rand((cout,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp, stride=s, padding=p, dilation=d, groups=groups).relu(), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    assert [_tile(px) in kern.source for kern in plan.kernels] == [True], [kern.name for kern in plan.kernels]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), s, p, d, groups)
    assert_close(got, want.relu().numpy(), "float32", f"direct lanes conv {case}", tol_scale=10)


def test_lanes_choice():
    """alexnet's 55-wide stem takes 4 x 5 lanes tiles, resnet's 112-wide one 4 x 7 (with 8 or 4-float vectors
    2 x 5 and 2 x 6); vgg16's 3x3 stem (27 patch elements) and channel counts that are not whole channel blocks
    (mobilenet_v2's 32 with 16-float vectors: half a block) stay in the pixel-vector form."""
    alexnet = F.Window(1, 3, 224, 224, 11, 11, 4, 4, 2, 2, 1, 1)
    resnet = F.Window(1, 3, 224, 224, 7, 7, 2, 2, 3, 3, 1, 1)
    vgg = F.Window(1, 3, 224, 224, 3, 3, 1, 1, 1, 1, 1, 1)
    wide = gemm_c.VW == 16
    assert gemm_c.direct_lanes(alexnet, 64, 363) == ((4, 5) if wide else (2, 5))
    assert gemm_c.direct_lanes(resnet, 64, 147) == ((4, 7) if wide else (2, 6))
    assert gemm_c.direct_lanes(vgg, 64, 27) is None
    assert gemm_c.direct_lanes(alexnet, gemm_c.DIRECT_LANES_CV * gemm_c.VW // 2, 363) is None


def test_lanes_convolution_with_weights_as_inputs():
    """Weights passed to the plan (not constants) are packed on every call: two calls with different weights each
    match PyTorch."""
    x = rand((1, 3, 29, 21), low=-1, high=1)  # 10-wide rows
    f = plait.jit(lambda t, wt: F.conv2d(t, wt, stride=2, padding=1), device="cpu")
    for seed in (1, 2):
        wt = rand((64, 3, 5, 5), seed=seed, low=-1, high=1) * 0.2
        got = np.asarray(f(x, wt))
        want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), None, 2, 1)
        assert_close(got, want.numpy(), "float32", f"lanes conv, weights {seed}", tol_scale=10)
    plan, _ = f.plan_for([x, wt])
    assert [_tile((5, 5)) in kern.source for kern in plan.kernels] == [True], [k.name for k in plan.kernels]
