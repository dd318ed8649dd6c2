"""Depthwise convolutions under autograd on the cpu: the weight gradient from the direct C kernel
(plait/graph/ops/depthwise_grad_c.py), the forward gathering from the image (no patch columns), against PyTorch."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.errors import ShapeError, UnsupportedError
from plait.graph import autodiff
from plait.graph.ops import depthwise_grad_c
from plait.graph.ops.conv import Window
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand

CASES = [  # n, c, h, w, kernel, stride, padding, dilation
    (2, 6, 9, 11, 3, 1, 1, 1),
    (2, 5, 12, 10, 3, 2, 1, 1),  # strided, as in mobilenet_v2
    (1, 4, 10, 9, (3, 5), (2, 1), (0, 2), (1, 2)),
    (3, 3, 7, 7, 3, 1, 0, 1),
    (2, 3, 20, 37, 3, 1, 1, 1),  # inner columns in register blocks of a vector, and the rest
    (1, 2, 12, 40, 3, 1, 2, 2),
]


@pytest.mark.parametrize("case", CASES)
def test_depthwise_gradients_match_torch(case):
    n, c, h, w, k, s, p, d = case
    kh, kw = (k, k) if isinstance(k, int) else k
    x, wt, b = rand((n, c, h, w)), rand((c, 1, kh, kw), seed=1), rand((c,), seed=2)
    xp, wp, bp = (plait.tensor(a, device="cpu", requires_grad=True) for a in (x, wt, b))
    out = F.conv2d(xp, wp, bp, s, p, d, c)
    up = rand(out.shape, seed=3)
    (out.relu() * plait.tensor(up, device="cpu")).sum().backward()
    xt, wtt, bt = (torch.tensor(a, requires_grad=True) for a in (x, wt, b))
    ref = torch.nn.functional.conv2d(xt, wtt, bt, s, p, d, c)
    (ref.relu() * torch.tensor(up)).sum().backward()
    assert_close(out.numpy(), ref.detach().numpy(), "float32", f"depthwise {case} forward", tol_scale=10)
    assert xp.grad is not None and wp.grad is not None and bp.grad is not None
    assert_close(wp.grad.numpy(), wtt.grad.numpy(), "float32", f"depthwise {case} weight gradient", tol_scale=10)
    assert_close(xp.grad.numpy(), xt.grad.numpy(), "float32", f"depthwise {case} input gradient", tol_scale=10)


def test_no_patch_columns():
    """The weight gradient reads the input in place, so the forward gathers from the image: no im2col at all."""
    x = plait.tensor(rand((2, 8, 10, 10)), device="cpu", requires_grad=True)
    wt = plait.tensor(rand((8, 1, 3, 3), seed=1), device="cpu", requires_grad=True)
    loss = F.conv2d(x, wt, None, 1, 1, 1, 8).relu().sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
    grads = autodiff.gradients(loss.node, seed, [x.node, wt.node])
    kinds = [k.name.split("_")[0] for k in Plan([loss.node, *grads.values()]).kernels]
    assert "DWWGRAD" in kinds and "IM2COL" not in kinds, kinds


def test_bad_input_is_refused():
    win = Window(1, 2, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1)
    x = plait.tensor(rand((1, 2, 6, 6)), device="cpu").node
    with pytest.raises(ShapeError, match="depthwise_wgrad_c"):
        depthwise_grad_c.depthwise_wgrad_c(plait.tensor(rand((1, 2, 5, 5)), device="cpu").node, x, win)
    x16 = plait.Tensor.from_numpy(rand((1, 2, 6, 6)).astype(np.float16), device="cpu").node
    with pytest.raises(UnsupportedError, match="float32 on the cpu"):
        depthwise_grad_c.depthwise_wgrad_c(x16, x16, win)
