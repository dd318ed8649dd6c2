"""The cpu's direct convolution over few input channels (gemm_c.plait_conv_direct: image stems such as resnet's 7x7/2
over 3 channels): each band of input rows is split once into the stride's column phases and every vector of output
pixels reads them at fixed offsets, with no patch panels. Checked against PyTorch on strides 1-4, padding, dilation,
output widths that end in partial vectors, channel counts that end in partial blocks, batches and groups."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c
from tests.helpers import assert_close, rand

CASES = [  # n, cin, h, w, cout, kernel, stride, padding, dilation, groups
    (2, 3, 37, 45, 16, 7, 2, 3, 1, 1),  # resnet's stem, small: two bands per image, a partial last vector (23 wide)
    (1, 3, 40, 41, 13, 11, 4, 2, 1, 1),  # alexnet's stem: stride 4, 13 channels (a partial block of 5)
    (1, 3, 34, 64, 8, 3, 2, 1, 1, 1),  # mobilenet_v2's stem: 32 outputs per row (two whole vectors)
    (1, 1, 19, 21, 10, 3, 1, 1, 2, 1),  # stride 1, dilation 2, one input channel
    (2, 4, 20, 23, 9, 5, 3, 2, 1, 1),  # stride 3 (three column phases), 4 channels
    (1, 4, 18, 18, 16, 3, 1, 1, 1, 2),  # two groups of 2 input channels each
]


@pytest.mark.parametrize("case", CASES)
def test_direct_convolution_matches_torch(case):
    n, cin, h, w, cout, k, s, p, d, groups = case
    x = rand((n, cin, h, w), low=-1, high=1)
    wt, b = rand((cout, cin // groups, k, k), seed=1, low=-1, high=1) * 0.2, rand((cout,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp, stride=s, padding=p, dilation=d, groups=groups).relu(), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    assert ["plait_conv_direct(" in kern.source for kern in plan.kernels] == [True], [k.name for k in plan.kernels]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), s, p, d, groups)
    assert_close(got, want.relu().numpy(), "float32", f"direct conv {case}", tol_scale=10)


def test_direct_convolution_choice():
    """Few input channels take the direct kernel; deeper inputs, fewer than 8 output channels and the folded columns
    of a weight gradient keep the implicit GEMM."""
    assert gemm_c.use_direct(F.Window(1, 3, 224, 224, 7, 7, 2, 2, 3, 3, 1, 1), 64, 147)
    assert not gemm_c.use_direct(F.Window(1, 16, 56, 56, 3, 3, 1, 1, 1, 1, 1, 1), 64, 144)
    assert not gemm_c.use_direct(F.Window(1, 3, 224, 224, 7, 7, 2, 2, 3, 3, 1, 1), 4, 147)
    assert not gemm_c.use_direct(F.Window(2, 3, 32, 32, 3, 3, 1, 1, 1, 1, 1, 1, fold=True), 16, 27)


def test_direct_convolution_gradients_match_torch():
    """A stem convolution under autograd: the forward and the input, weight and bias gradients against PyTorch."""
    x, wt, b = rand((2, 3, 21, 19)), rand((8, 3, 5, 5), seed=1) * 0.2, rand((8,), seed=2)
    xp, wp, bp = (plait.tensor(a, device="cpu", requires_grad=True) for a in (x, wt, b))
    out = F.conv2d(xp, wp, bp, stride=2, padding=2)
    up = rand(out.shape, seed=3)
    (out.relu() * plait.tensor(up, device="cpu")).sum().backward()
    xt, wtt, bt = (torch.tensor(a, requires_grad=True) for a in (x, wt, b))
    ref = torch.nn.functional.conv2d(xt, wtt, bt, stride=2, padding=2)
    (ref.relu() * torch.tensor(up)).sum().backward()
    assert_close(out.numpy(), ref.detach().numpy(), "float32", "stem forward", tol_scale=10)
    assert xp.grad is not None and wp.grad is not None and bp.grad is not None
    assert_close(xp.grad.numpy(), xt.grad.numpy(), "float32", "stem input gradient", tol_scale=10)
    assert_close(wp.grad.numpy(), wtt.grad.numpy(), "float32", "stem weight gradient", tol_scale=10)
    assert_close(bp.grad.numpy(), bt.grad.numpy(), "float32", "stem bias gradient", tol_scale=10)
