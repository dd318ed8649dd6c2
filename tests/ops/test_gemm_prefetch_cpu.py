"""The cpu GEMM's software prefetches (gemm_c.A_AHEAD: the next row block of weights read in place; gemm_c.PACK_AHEAD:
the input rows a few channels ahead while a 1x1 window's patch columns are packed) only hint the cache, so products
must stay exact where they run: 1x1 convolutions at stride 1 and 2, with and without padding (hinted rows outside the
plane), output channels that end in a partial row block (its rows packed, not read in place, so the hint must stop
before them), channels fewer and more than the prefetch distance, checked against PyTorch."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c
from tests.helpers import assert_close, rand

CASES = [  # n, cin, h, w, cout, stride, padding
    (1, 64, 28, 28, 52, 2, 0),  # a downsample: 14x14 outputs, 52 rows = 6 whole row blocks and a partial one
    (1, 3, 20, 18, 24, 2, 0),  # fewer channels than the prefetch distance
    (1, 40, 15, 17, 33, 2, 1),  # padding: hinted rows past the plane's edge
    (2, 24, 16, 16, 40, 2, 0),  # two images whose narrow outputs merge into one product
    (1, 96, 24, 24, 72, 1, 0),  # stride 1: a plain product, weights read in place over several row blocks
    (1, 300, 10, 10, 20, 2, 0),  # k = 300: two k blocks
]


@pytest.mark.parametrize("case", CASES)
def test_prefetching_1x1_convolution_matches_torch(case):
    assert gemm_c.A_AHEAD and gemm_c.PACK_AHEAD  # the paths under test are on
    n, cin, h, w, cout, s, p = case
    x = rand((n, cin, h, w), low=-1, high=1)
    wt, b = rand((cout, cin, 1, 1), seed=1, low=-1, high=1) * 0.2, rand((cout,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp, stride=s, padding=p), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    assert any(kern.name.startswith(("CONV_", "GEMM_")) for kern in plan.kernels), [k.name for k in plan.kernels]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), s, p)
    assert_close(got, want.numpy(), "float32", f"1x1 conv {case}", tol_scale=10)
