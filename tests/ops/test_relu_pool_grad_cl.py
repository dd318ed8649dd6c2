"""Max pooling over a ReLU under autograd on OpenCL (`plait.nn.functional._relu_pool_grad`): the pool's gradient
goes straight to the ReLU's input, masked by the pooled output being positive, instead of through ReLU's own
backward pass over the whole input. Checked exactly against PyTorch (the mask multiplies by 0 or 1), with windows
that are all negative or zero, ties, padding, and a second reader of the ReLU's output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from tests.conftest import DEVICES
from tests.helpers import rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]

CASES = [  # shape, kernel, stride, padding
    ((2, 3, 11, 11), 3, 2, 0),  # alexnet's overlapping pools
    ((2, 2, 9, 9), 3, 2, 1),  # resnet's stem pool, padded
    ((1, 2, 8, 7), 2, 1, 0),
]


def _input(shape: tuple[int, ...]) -> np.ndarray:
    """Values with ties at zero and whole windows at or below zero, where ReLU's mask decides."""
    z = rand(shape)
    z[..., 1::3, :] = 0.0
    z[..., :3, :3] = -np.abs(z[..., :3, :3])
    return z


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_relu_pool_gradient_matches_torch(device: str, case: tuple) -> None:
    shape, k, s, p = case
    z = _input(shape)
    up = rand(tuple(torch.nn.functional.max_pool2d(torch.tensor(z), k, s, p).shape), seed=1)
    zp = plait.tensor(z, device=device, requires_grad=True)
    out = F.max_pool2d(F.relu(zp), k, s, p)
    (out * plait.tensor(up, device=device)).sum().backward()
    zt = torch.tensor(z, requires_grad=True)
    ref = torch.nn.functional.max_pool2d(torch.relu(zt), k, s, p)
    (ref * torch.tensor(up)).sum().backward()
    assert zp.grad is not None and zt.grad is not None
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    np.testing.assert_array_equal(zp.grad.numpy(), zt.grad.numpy())


@pytest.mark.parametrize("device", CL_DEVICES)
def test_second_reader_of_the_relu(device: str) -> None:
    """The ReLU's output also feeds a sum: that reader's gradient still goes through ReLU's backward, and the
    two contributions add up to PyTorch's."""
    z = _input((2, 2, 7, 7))
    up = rand((2, 2, 3, 3), seed=1)
    zp = plait.tensor(z, device=device, requires_grad=True)
    r = F.relu(zp)
    (((F.max_pool2d(r, 3, 2) * plait.tensor(up, device=device)).sum()) + (r * r).sum()).backward()
    zt = torch.tensor(z, requires_grad=True)
    rt = torch.relu(zt)
    ((torch.nn.functional.max_pool2d(rt, 3, 2) * torch.tensor(up)).sum() + (rt * rt).sum()).backward()
    assert zp.grad is not None and zt.grad is not None
    np.testing.assert_allclose(zp.grad.numpy(), zt.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_no_relu_backward_over_the_input(device: str) -> None:
    """The gradient reaching the ReLU's input is the pool's gather itself: no where-pass of the input's size."""
    zp = plait.tensor(_input((2, 3, 11, 11)), device=device, requires_grad=True)
    out = F.max_pool2d(F.relu(zp * 2.0), 3, 2)
    seed = plait.Tensor.from_numpy(np.ones(out.shape, np.float32), device=device).node
    grads = autodiff.gradients(out.node, seed, [zp.node])
    g = grads[zp.node.uid]
    seen, stack, ops = set(), [g], []
    while stack:
        n = stack.pop()
        if n.uid in seen:
            continue
        seen.add(n.uid)
        ops.append((n.op, n.shape))
        stack.extend(n.srcs)
    assert ("max_pool2d_grad_cl", (2, 3, 11, 11)) in ops
    assert ("where", (2, 3, 11, 11)) not in ops
    assert ("where", (2, 3, 5, 5)) in ops
