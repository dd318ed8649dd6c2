"""Training convolutions on the cpu whose forward runs per image (implicit GEMM or Winograd gathering from the
image, `nn.functional._forward_per_image`) while the weight gradient reads folded patch columns: output, input and
weight gradients against PyTorch, and the forward kernels checked to be the per-image ones."""

import pytest
import torch

import plait
import plait.nn.functional as F
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand

CASES = [  # n, c, h, w, co, padding: 3x3 stride 1, at least 16 input channels and 128 output positions per image
    (2, 16, 12, 12, 16, 1),
    (2, 16, 14, 13, 24, 0),
    (1, 24, 12, 14, 16, 2),
]


@pytest.mark.parametrize("case", CASES)
def test_forward_per_image_gradients_match_torch(case):
    n, c, h, w, co, pad = case
    x, wt, b, up = rand((n, c, h, w)), rand((co, c, 3, 3), seed=1), rand((co,), seed=2), None
    xp = plait.tensor(x, device="cpu", requires_grad=True)
    wp = plait.tensor(wt, device="cpu", requires_grad=True)
    bp = plait.tensor(b, device="cpu", requires_grad=True)
    assert F._forward_per_image(xp, F.Window(n, c, h, w, 3, 3, 1, 1, pad, pad, 1, 1, fold=True), 1, co)
    out = F.conv2d(xp, wp, bp, padding=pad)
    up = rand(out.shape, seed=3)  # a non-uniform output gradient, through a ReLU
    (out.relu() * plait.tensor(up, device="cpu")).sum().backward()
    xt, wtt, bt = (torch.tensor(a, requires_grad=True) for a in (x, wt, b))
    ref = torch.nn.functional.conv2d(xt, wtt, bt, padding=pad)
    (ref.relu() * torch.tensor(up)).sum().backward()
    assert_close(out.numpy(), ref.detach().numpy(), "float32", f"conv2d {case} forward", tol_scale=10)
    assert xp.grad is not None and wp.grad is not None and bp.grad is not None
    assert_close(xp.grad.numpy(), xt.grad.numpy(), "float32", f"conv2d {case} input gradient", tol_scale=10)
    assert_close(wp.grad.numpy(), wtt.grad.numpy(), "float32", f"conv2d {case} weight gradient", tol_scale=10)
    assert_close(bp.grad.numpy(), bt.grad.numpy(), "float32", f"conv2d {case} bias gradient", tol_scale=10)


def test_forward_per_image_kernels():
    """The forward reads the image through the convolution kernels (no folded product over patch columns); the
    folded columns are made for the weight gradient only."""
    x = plait.tensor(rand((2, 16, 12, 12)), device="cpu", requires_grad=True)
    wt = plait.tensor(rand((16, 16, 3, 3), seed=1), device="cpu", requires_grad=True)
    plan = Plan([F.conv2d(x, wt, padding=1).relu().node])
    kinds = [k.name.split("_")[0] for k in plan.kernels]
    assert "IM2COL" not in kinds and kinds[-1] in ("CONV", "WINO4"), kinds


def test_small_or_first_layers_stay_folded():
    """Few positions per image (8x8) or few input channels (a first layer) keep the folded product."""
    win = F.Window(2, 16, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, fold=True)
    x = plait.tensor(rand((2, 16, 8, 8)), device="cpu")
    assert not F._forward_per_image(x, win, 1, 16)
    x3 = plait.tensor(rand((2, 3, 32, 32)), device="cpu")
    assert not F._forward_per_image(x3, F.Window(2, 3, 32, 32, 3, 3, 1, 1, 1, 1, 1, 1, fold=True), 1, 16)


def test_large_weight_gradient_matches_torch():
    """A weight of 2**20 or more values takes dy @ columns^T (no transposed copy afterwards)."""
    x, wt = rand((2, 228, 4, 4)), rand((512, 228, 3, 3), seed=1)
    assert wt.size >= F.WGRAD_PLAIN_MIN
    xp = plait.tensor(x, device="cpu", requires_grad=True)
    wp = plait.tensor(wt, device="cpu", requires_grad=True)
    up = rand((2, 512, 4, 4), seed=3)
    (F.conv2d(xp, wp, padding=1) * plait.tensor(up, device="cpu")).sum().backward()
    xt, wtt = torch.tensor(x, requires_grad=True), torch.tensor(wt, requires_grad=True)
    (torch.nn.functional.conv2d(xt, wtt, padding=1) * torch.tensor(up)).sum().backward()
    assert xp.grad is not None and wp.grad is not None
    assert_close(wp.grad.numpy(), wtt.grad.numpy(), "float32", "large conv2d weight gradient", tol_scale=10)
    assert_close(xp.grad.numpy(), xt.grad.numpy(), "float32", "large conv2d input gradient", tol_scale=10)
