"""Stride-2 convolutions on the cpu's implicit GEMM (resnet's downsampling 3x3 layers), whose packing gathers every
other input column of each patch row into the panels (gemm_c.plait_pack_win). Checked against PyTorch on odd and even
widths, padding 0-2, 2x2 to 5x5 kernels, channels spanning several k blocks, and batches whose narrow outputs merge
into one product."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from tests.helpers import assert_close, rand

CASES = [  # n, cin, h, w, cout, kernel, padding
    (1, 40, 17, 19, 24, 3, 1),  # odd height and width, k = 360: two k blocks
    (2, 8, 14, 15, 16, 3, 1),  # two images of 7x8 outputs: their columns merge into one product
    (1, 16, 12, 13, 8, 2, 0),  # 2x2 taps, no padding
    (1, 6, 23, 22, 10, 5, 2),  # 5x5 taps, padding 2
    (3, 5, 9, 9, 9, 3, 0),  # three images, no padding
    (1, 12, 60, 58, 16, 3, 1),  # 30x29 outputs: several column tasks, runs that end inside a panel
]


@pytest.mark.parametrize("case", CASES)
def test_stride2_convolution_matches_torch(case):
    n, cin, h, w, cout, k, p = case
    x = rand((n, cin, h, w), low=-1, high=1)
    wt, b = rand((cout, cin, k, k), seed=1, low=-1, high=1) * 0.2, rand((cout,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp, stride=2, padding=p), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    assert any(kern.name.startswith("CONV_") for kern in plan.kernels), [kern.name for kern in plan.kernels]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), 2, p)
    assert_close(got, want.numpy(), "float32", f"stride-2 conv {case}", tol_scale=10)
