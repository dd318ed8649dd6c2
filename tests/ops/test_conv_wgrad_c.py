"""The cpu weight gradient of a convolution as one kernel that reads dy in place and gathers the patch rows of x
(plait/graph/ops/conv_wgrad_c.py), against PyTorch: the op alone, and training convolutions that use it (their
forward then gathers from the image, so no im2col buffer is made)."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.errors import ShapeError, UnsupportedError
from plait.graph import autodiff
from plait.graph.ops import conv_wgrad_c
from plait.graph.ops.conv import Window
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand

CASES = [  # n, c, h, w, co, (kh, kw), (sh, sw), (ph, pw), (dh, dw)
    (2, 3, 9, 11, 5, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 4, 11, 10, 7, (3, 3), (2, 2), (1, 1), (1, 1)),  # strided
    (2, 3, 20, 20, 64, (7, 7), (2, 2), (3, 3), (1, 1)),  # a stem: 147 patch rows, two row chunks
    (1, 12, 10, 10, 130, (3, 3), (1, 1), (1, 1), (1, 1)),  # 108 patch rows x 130 channels: chunks on both sides
    (2, 8, 24, 24, 6, (3, 3), (1, 1), (1, 1), (1, 1)),  # 1152 positions: three blocks, split into summed parts
    (4, 8, 8, 8, 12, (1, 1), (2, 2), (0, 0), (1, 1)),  # a strided 1x1 projection
    (2, 5, 13, 12, 9, (3, 5), (3, 1), (2, 0), (1, 2)),  # stride 3, rectangular and dilated
    # dy read in place (planes of whole vectors, channels a multiple of 4): blocks within one image
    (2, 3, 28, 28, 12, (3, 3), (1, 1), (1, 1), (1, 1)),  # 784 positions: blocks of 400 and 384 per image
    (3, 4, 32, 32, 8, (3, 3), (2, 2), (1, 1), (1, 1)),  # 16x16 out: one block per image, parts over images
    (1, 12, 8, 8, 132, (3, 3), (1, 1), (1, 1), (1, 1)),  # 132 channels: a second channel chunk of 4
    # stride 1: x and dy padded once, read in place at shifted offsets (plait_wgrad_s1)
    (2, 5, 13, 12, 9, (3, 5), (1, 1), (2, 0), (1, 2)),  # rectangular, dilated, padded on one axis only
    (11, 3, 7, 7, 6, (3, 3), (1, 1), (1, 1), (1, 1)),  # 7x7 planes: 8 images per block, a block of 3
    (3, 7, 30, 30, 5, (3, 3), (1, 1), (1, 1), (1, 1)),  # 30x32 padded positions: three blocks per image
    (2, 4, 6, 9, 3, (2, 2), (1, 1), (0, 1), (1, 1)),  # an even window, no row padding, 3 channels
]


def _torch_wgrad(x: np.ndarray, dy: np.ndarray, wshape: tuple, s: tuple, p: tuple, d: tuple) -> np.ndarray:
    return torch.nn.grad.conv2d_weight(torch.tensor(x), wshape, torch.tensor(dy), s, p, d).numpy()


@pytest.mark.parametrize("case", CASES)
def test_weight_gradient_matches_torch(case):
    n, c, h, w, co, (kh, kw), (sh, sw), (ph, pw), (dh, dw) = case
    win = Window(n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw)
    x, dy = rand((n, c, h, w)), rand((n, co, win.oh, win.ow), seed=1)
    node = conv_wgrad_c.conv_wgrad_c(plait.tensor(dy, device="cpu").node, plait.tensor(x, device="cpu").node, win)
    want = _torch_wgrad(x, dy, (co, c, kh, kw), (sh, sw), (ph, pw), (dh, dw))
    # each entry sums up to 1152 products of values in [-2, 2]
    assert_close(plait.Tensor(node).numpy(), want, "float32", f"conv_wgrad_c {case}", tol_scale=10)


@pytest.mark.parametrize("case", [CASES[1], CASES[2], CASES[4]])
def test_training_convolution_matches_torch(case, monkeypatch):
    """A training convolution that takes the kernel (every size allowed here): forward, input, weight and bias
    gradients against torch; its plan has the kernel and no im2col."""
    monkeypatch.setattr(conv_wgrad_c, "wins", lambda win: True)
    n, c, h, w, co, (kh, kw), s, p, d = case
    x, wt, b = rand((n, c, h, w)), rand((co, c, kh, kw), seed=1), rand((co,), seed=2)
    xp, wp, bp = (plait.tensor(a, device="cpu", requires_grad=True) for a in (x, wt, b))
    out = F.conv2d(xp, wp, bp, s, p, d)
    up = rand(out.shape, seed=3)
    loss = (out.relu() * plait.tensor(up, device="cpu")).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
    grads = autodiff.gradients(loss.node, seed, [xp.node, wp.node])
    kinds = [k.name.split("_")[0] for k in Plan([loss.node, *grads.values()]).kernels]
    assert "WGRAD" in kinds and "IM2COL" not in kinds, kinds
    loss.backward()
    xt, wtt, bt = (torch.tensor(a, requires_grad=True) for a in (x, wt, b))
    ref = torch.nn.functional.conv2d(xt, wtt, bt, s, p, d)
    (ref.relu() * torch.tensor(up)).sum().backward()
    assert_close(out.numpy(), ref.detach().numpy(), "float32", f"conv2d {case} forward", tol_scale=10)
    assert xp.grad is not None and wp.grad is not None and bp.grad is not None
    assert_close(wp.grad.numpy(), wtt.grad.numpy(), "float32", f"conv2d {case} weight gradient", tol_scale=10)
    assert_close(xp.grad.numpy(), xt.grad.numpy(), "float32", f"conv2d {case} input gradient", tol_scale=10)
    assert_close(bp.grad.numpy(), bt.grad.numpy(), "float32", f"conv2d {case} bias gradient", tol_scale=10)


def test_chosen_only_for_large_planes():
    """resnet18's 56x56 and 14x14 layers at batch 16 take the kernel, stride-1 ones at any batch; its 7x7 layers and
    strided layers at small batches keep the folded GEMM."""
    assert conv_wgrad_c.wins(Window(16, 64, 56, 56, 3, 3, 1, 1, 1, 1))
    assert conv_wgrad_c.wins(Window(16, 256, 14, 14, 3, 3, 1, 1, 1, 1))
    assert conv_wgrad_c.wins(Window(2, 64, 28, 28, 3, 3, 1, 1, 1, 1))
    assert not conv_wgrad_c.wins(Window(16, 512, 7, 7, 3, 3, 1, 1, 1, 1))
    assert not conv_wgrad_c.wins(Window(2, 64, 28, 28, 3, 3, 2, 2, 1, 1))


def test_bad_input_is_refused():
    win = Window(1, 2, 6, 6, 3, 3, 1, 1, 1, 1)
    x = plait.tensor(rand((1, 2, 6, 6)), device="cpu").node
    with pytest.raises(ShapeError, match="conv_wgrad_c"):
        conv_wgrad_c.conv_wgrad_c(plait.tensor(rand((1, 4, 5, 5)), device="cpu").node, x, win)
    one = Window(1, 2, 6, 6, 1, 1)
    with pytest.raises(UnsupportedError, match="1x1 stride 1"):
        conv_wgrad_c.conv_wgrad_c(plait.tensor(rand((1, 4, 6, 6)), device="cpu").node, x, one)
