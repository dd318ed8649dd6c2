"""Max pooling under autograd on OpenCL (plait/graph/ops/pool_cl.py): the windows' first maxima as offsets, the
output taken at them and the gradient gathered per input pixel, against PyTorch. The gradient is compared exactly:
each window's gradient lands on the same input as PyTorch's (ties go to the first tap), and the windows' shares
are added in PyTorch's order. The training step makes no im2col columns and no col2im for the pool."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.errors import PlaitError, UnsupportedError
from plait.graph import autodiff
from plait.graph.ops import pool_cl
from plait.graph.ops.pool import PoolGeometry
from plait.schedule.plan import Plan
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]

CASES = [  # shape, kernel, stride, padding, dilation, ceil_mode
    ((2, 3, 11, 11), 3, 2, 1, 1, False),  # resnet's stem pool
    ((2, 2, 13, 13), 3, 2, 0, 1, False),  # alexnet's pools
    ((2, 2, 9, 10), 3, 2, 0, 1, True),  # ceil-mode windows past the far edge
    ((1, 3, 10, 9), (3, 2), (1, 2), (1, 0), (2, 1), False),
    ((1, 1, 7, 7), 3, 1, 1, 1, False),
    # blocks of sh x sw pixels (`pool_cl._grad_blocks`): three windows per block along y, padding not a whole block
    ((1, 2, 12, 11), (5, 4), (2, 3), (2, 1), 1, True),
    ((2, 1, 8, 9), 2, 2, 0, 1, False),  # windows that do not overlap
]


def _both(device: str, x: np.ndarray, up: np.ndarray, args: tuple) -> tuple:
    xp = plait.tensor(x, device=device, requires_grad=True)
    out = F.max_pool2d(xp, *args)
    (out * plait.tensor(up, device=device)).sum().backward()
    xt = torch.tensor(x, requires_grad=True)
    ref = torch.nn.functional.max_pool2d(xt, *args)
    (ref * torch.tensor(up)).sum().backward()
    assert xp.grad is not None and xt.grad is not None
    return out.numpy(), ref.detach().numpy(), xp.grad.numpy(), xt.grad.numpy()


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_max_pool_gradient_matches_torch(device: str, case: tuple) -> None:
    shape, *args = case
    x = rand(shape)
    x[..., ::3, 1::2] = 0.0  # ties inside windows
    up = rand(tuple(torch.nn.functional.max_pool2d(torch.tensor(x), *args).shape), seed=1)
    got, want, gx, gt = _both(device, x, up, tuple(args))
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(gx, gt)


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("case", CASES[:3])
def test_many_ties_match_torch(device: str, case: tuple) -> None:
    """Inputs of three distinct values: most windows hold several maxima, so a wrong pick shows everywhere."""
    shape, *args = case
    x = np.random.default_rng(5).integers(0, 3, shape).astype(np.float32)
    up = rand(tuple(torch.nn.functional.max_pool2d(torch.tensor(x), *args).shape), seed=1)
    _, _, gx, gt = _both(device, x, up, tuple(args))
    np.testing.assert_array_equal(gx, gt)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_nan_window_gets_the_gradient(device: str) -> None:
    x = rand((1, 1, 6, 6))
    x[0, 0, 2, 3] = np.nan
    got, want, gx, gt = _both(device, x, rand((1, 1, 3, 3), seed=1), (3, 2, 1, 1, False))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(gx, gt)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_float16_pool_gradient(device: str) -> None:
    x = rand((2, 2, 9, 9)).astype(np.float16)
    up = rand((2, 2, 4, 4), seed=1).astype(np.float16)
    xp = plait.Tensor.from_numpy(x, device=device).requires_grad_()
    out = F.max_pool2d(xp, 3, 2)
    (out * plait.Tensor.from_numpy(up, device=device)).sum().backward()
    xt = torch.tensor(x.astype(np.float32), requires_grad=True)
    ref = torch.nn.functional.max_pool2d(xt, 3, 2)
    (ref * torch.tensor(up.astype(np.float32))).sum().backward()
    assert xp.grad is not None and xt.grad is not None
    np.testing.assert_array_equal(out.numpy().astype(np.float32), ref.detach().numpy())
    assert_close(xp.grad.numpy().astype(np.float32), xt.grad.numpy(), "float16", "float16 max-pool gradient")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_training_step_kernels(device: str) -> None:
    """Three launches for the pool: offsets, output, gradient; no im2col columns, no col2im, no max reduction."""
    xp = plait.tensor(rand((2, 4, 9, 9)), device=device, requires_grad=True)
    loss = (F.max_pool2d(xp, 3, 2, 1) * 2.0).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    grads = autodiff.gradients(loss.node, seed, [xp.node])
    ops = [it.out.op for it in Plan([loss.node, *grads.values()]).items]
    assert "im2col" not in ops and "col2im" not in ops, ops
    for op in ("max_pool2d_argmax_cl", "max_pool2d_take_cl", "max_pool2d_grad_cl"):
        assert ops.count(op) == 1, ops


def test_bad_input_is_refused() -> None:
    geo = PoolGeometry(1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 1, 1, 2, 2)
    x = plait.tensor(rand((1, 1, 4, 4)), device="cpu").node
    with pytest.raises(UnsupportedError, match="OpenCL devices only"):
        pool_cl.max_pool2d_argmax_cl(x, geo)
    with pytest.raises(PlaitError, match="does not match the pooling geometry"):
        pool_cl.max_pool2d_argmax_cl(plait.tensor(rand((1, 1, 5, 4)), device="cpu").node, geo)
    past = PoolGeometry(1, 1, 4, 4, 2, 2, 2, 2, 0, 0, 1, 1, 3, 2)  # a third row of windows starts past the input
    with pytest.raises(PlaitError, match="lies wholly in the padding or past the input"):
        pool_cl.max_pool2d_argmax_cl(x, past)
    at = plait.Tensor.from_numpy(np.zeros((1, 1, 2, 2), np.int32), device="cpu").node
    with pytest.raises(PlaitError, match="max_pool2d_take_cl"):
        pool_cl.max_pool2d_take_cl(x, x, geo)
    with pytest.raises(PlaitError, match="max_pool2d_grad_cl"):
        pool_cl.max_pool2d_grad_cl(at, plait.tensor(rand((1, 1, 3, 3)), device="cpu").node, geo)
