"""Max pooling under autograd on the cpu: the pooling kernel forward and the direct gradient kernel
(plait/graph/ops/pool_grad.py), against PyTorch, including ties (which go to the window's first maximum, as in
PyTorch), padding, dilation, ceil mode, tiling windows and NaN."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.errors import UnsupportedError
from plait.graph import autodiff
from plait.graph.ops import pool_grad
from plait.graph.ops.pool import PoolGeometry
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand

CASES = [  # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 11, 11), 3, 2, 1, 1, False),  # resnet's stem pool
    ((1, 2, 8, 8), 2, 2, 0, 1, False),  # windows that tile the input
    ((2, 2, 9, 10), 3, 2, 0, 1, True),  # ceil-mode windows past the far edge
    ((1, 3, 10, 9), (3, 2), (1, 2), (1, 0), (2, 1), False),
    ((1, 1, 7, 7), 3, 1, 1, 1, False),
]


def _both(x: np.ndarray, up: np.ndarray, args: tuple) -> tuple:
    k, s, p, d, ceil = args
    xp = plait.tensor(x, device="cpu", requires_grad=True)
    out = F.max_pool2d(xp, k, s, p, d, ceil)
    (out * plait.tensor(up, device="cpu")).sum().backward()
    xt = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.max_pool2d(xt, k, s, p, d, ceil)
    (ref * torch.tensor(up)).sum().backward()
    assert xp.grad is not None and xt.grad is not None
    return out.numpy(), ref.detach().numpy(), xp.grad.numpy(), xt.grad.numpy()


@pytest.mark.parametrize("case", CASES)
def test_max_pool_gradient_matches_torch(case):
    shape, *args = case
    x = rand(shape)
    x[..., ::3, 1::2] = 0.0  # ties inside windows
    torch_out = torch.nn.functional.max_pool2d(torch.tensor(x), *args)
    up = rand(tuple(torch_out.shape), seed=1)
    got, want, gx, gt = _both(x, up, tuple(args))
    assert_close(got, want, "float32", f"max_pool2d {case}")
    np.testing.assert_array_equal(gx, gt)  # one window's gradient lands on exactly one input, the same as torch's


@pytest.mark.parametrize("case", CASES)
def test_many_ties_match_torch(case):
    """Inputs of three distinct values: most windows hold several maxima, and any tap read at a wrong offset would
    likely equal the maximum too, so the picked positions are checked everywhere."""
    shape, *args = case
    x = np.random.default_rng(5).integers(0, 3, shape).astype(np.float32)
    up = rand(tuple(torch.nn.functional.max_pool2d(torch.tensor(x), *args).shape), seed=1)
    _, _, gx, gt = _both(x, up, tuple(args))
    np.testing.assert_array_equal(gx, gt)


def test_all_equal_windows_give_the_first_tap():
    x = np.zeros((1, 1, 4, 4), np.float32)
    _, _, gx, gt = _both(x, np.ones((1, 1, 2, 2), np.float32), (2, 2, 0, 1, False))
    np.testing.assert_array_equal(gx, gt)
    assert gx[0, 0, 0, 0] == 1.0 and gx.sum() == 4.0


def test_nan_window_gets_the_gradient():
    x = rand((1, 1, 6, 6))
    x[0, 0, 2, 3] = np.nan
    up = rand((1, 1, 3, 3), seed=1)
    got, want, gx, gt = _both(x, up, (3, 2, 1, 1, False))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(gx, gt)


def test_training_step_kernels():
    """Forward and gradient are one kernel each: no im2col columns, no col2im."""
    xp = plait.tensor(rand((2, 4, 9, 9)), device="cpu", requires_grad=True)
    loss = (F.max_pool2d(xp, 3, 2, 1) * 2.0).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
    grads = autodiff.gradients(loss.node, seed, [xp.node])
    kinds = [k.name.split("_")[0] for k in Plan([loss.node, *grads.values()]).kernels]
    assert "POOL" in kinds and "POOLGRAD" in kinds and "IM2COL" not in kinds and "COL2IM" not in kinds, kinds


def test_bad_input_is_refused():
    geo = PoolGeometry(1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 1, 1, 2, 2)
    x = plait.tensor(rand((1, 1, 4, 4)), device="cpu").node
    y = plait.tensor(rand((1, 1, 2, 2)), device="cpu").node
    with pytest.raises(plait.PlaitError, match="max_pool2d_grad"):
        pool_grad.max_pool2d_grad(x, y, plait.tensor(rand((1, 1, 3, 3)), device="cpu").node, geo)
    x16 = plait.Tensor.from_numpy(rand((1, 1, 4, 4)).astype(np.float16), device="cpu").node
    with pytest.raises(UnsupportedError, match="float32 on the cpu"):
        pool_grad.max_pool2d_grad(x16, y, y, geo)
