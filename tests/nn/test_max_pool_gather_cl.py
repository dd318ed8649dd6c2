"""Max pooling under autograd on OpenCL without im2col columns (`functional._max_pool_gather`): the forward as the
maxima of the strided views, the gradient gathered per input position from the windows covering it. Output and
input gradient against PyTorch on every device (the cpu keeps its pooling kernels), including overlapping, clipped
and non-overlapping windows, and ties (split evenly on OpenCL, as the max reduction's gradient does)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from tests.helpers import assert_close


@pytest.mark.parametrize(
    ("shape", "k", "s", "p"),
    [((2, 3, 12, 12), 3, 2, 1), ((1, 2, 9, 11), 3, 2, 0), ((2, 2, 9, 9), 2, 2, 0), ((1, 2, 10, 10), 3, 1, 1)],
)
def test_max_pool_gradient_matches_torch(device: str, shape: tuple[int, ...], k: int, s: int, p: int) -> None:
    """relu then max pool then a weighted sum; relu's zeros make windows of tied maxima, whose gradient relu
    stops again, so the result is PyTorch's whichever tap takes a tie."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal(shape).astype(np.float32)
    xs[0, 0, :4, :4] = 0.0
    x = plait.tensor(xs, device=device, requires_grad=True)
    y = F.max_pool2d(F.relu(x), k, s, p)
    ws = rng.standard_normal(y.shape).astype(np.float32)
    loss = (y * plait.tensor(ws, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    got = plait.Tensor(autodiff.gradients(loss.node, seed, [x.node])[x.node.uid]).numpy()
    xr = torch.tensor(xs, requires_grad=True)
    yr = torch.nn.functional.max_pool2d(torch.relu(xr), k, s, p)
    (yr * torch.tensor(ws)).sum().backward()
    assert xr.grad is not None
    assert_close(y.numpy(), yr.detach().numpy(), "float32", "max pool output")
    assert_close(got, xr.grad.numpy(), "float32", "max pool input gradient")


def test_tied_window_splits_its_gradient_on_opencl() -> None:
    """A 3x3 window (stride 2: not the tiled form) whose nine values are equal hands each a ninth of its gradient
    on OpenCL (the form the max reduction's gradient takes, and the columns form before)."""
    try:
        x = plait.tensor(np.ones((1, 1, 3, 3), np.float32), device="opencl:0", requires_grad=True)
    except plait.PlaitError as e:
        pytest.skip(f"no OpenCL device: {e}")
    y = F.max_pool2d(x, 3, 2, 0)
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="opencl:0").node
    got = plait.Tensor(autodiff.gradients(y.sum().node, seed, [x.node])[x.node.uid]).numpy()
    np.testing.assert_allclose(got, np.full((1, 1, 3, 3), 1 / 9, np.float32), rtol=1e-6)
