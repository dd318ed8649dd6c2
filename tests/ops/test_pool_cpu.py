"""The cpu device's max-pooling kernel (plait/codegen/pool_c.py), which plait.nn.functional.max_pool2d builds for
float32 inference there: every window geometry (padding, strides, dilation, ceil-mode overhang, windows clipped at
every edge), NaN and -inf, against PyTorch; and the forms kept elsewhere (a recorded gradient, other dtypes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import pool_c
from plait.errors import PlaitError
from plait.graph.ops import pool
from tests.helpers import rand

# (shape, kernel, stride, padding, dilation, ceil_mode)
GEOMETRIES = [
    ((1, 8, 112, 112), 3, 2, 1, 1, False),  # resnet's stem pool
    ((2, 3, 9, 11), 3, 1, 1, 1, False),
    ((1, 2, 13, 13), 3, 2, 0, 1, True),  # alexnet's pool, a ceil-mode window past the far edge
    ((1, 2, 10, 9), 2, 2, 0, 1, False),  # vgg's pool on an odd width
    ((1, 3, 12, 12), 3, 2, 1, 2, True),
    ((1, 1, 5, 5), 5, 1, 2, 1, False),  # every window clipped
    ((2, 2, 7, 8), (2, 3), (1, 2), (1, 1), 1, True),
]


def _pool(x: np.ndarray, k, s, p, d, ceil) -> tuple[np.ndarray, list[str]]:
    f = plait.jit(lambda t: F.max_pool2d(t, k, s, p, d, ceil), device="cpu")
    got = f(x)
    plan, _ = f.plan_for([x])
    return got, [kern.name.split("_")[0] for kern in plan.kernels]


@pytest.mark.parametrize(("shape", "k", "s", "p", "d", "ceil"), GEOMETRIES)
def test_pool_kernel_matches_torch(shape, k, s, p, d, ceil):
    """Bit for bit: the maximum of the same values, whatever order the kernel takes them in."""
    x = rand(shape, "float32", seed=1)
    got, kinds = _pool(x, k, s, p, d, ceil)
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x), k, s, p, d, ceil_mode=ceil).numpy()
    assert kinds == ["POOL"], kinds
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("shape", "k", "s", "p", "d", "ceil"), GEOMETRIES[:3])
def test_pool_kernel_propagates_nan_and_keeps_infinities(shape, k, s, p, d, ceil):
    """A NaN reaches exactly the windows that hold it, in a plane whose earlier rows had none (the kernel switches
    to the NaN-testing maximum from the row where it first appears) and in the first row of another; -inf inputs and
    windows of -inf stay -inf, +inf wins."""
    x = rand(shape, "float32", seed=2)
    h, w = shape[2:]
    x[0, -1, : h // 2] = -np.inf
    x[0, -1, h - 1, w - 1] = np.inf
    x[0, 0, h - 2, w // 2] = np.nan
    x[-1, -1, 0, 0] = np.nan
    got, _ = _pool(x, k, s, p, d, ceil)
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x), k, s, p, d, ceil_mode=ceil).numpy()
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[0, 0]).any() and np.isnan(got[-1, -1]).any()


def test_pool_kernel_reads_a_fused_input_expression():
    """The pool's input is a buffer: a bias + ReLU in front of it is realized first (as a convolution's epilogue
    would be), and the pooled result feeds later elementwise work."""
    x, b = rand((2, 4, 15, 15), "float32", seed=3), rand((4, 1, 1), "float32", seed=4)
    tb = plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.max_pool2d((t + tb).relu(), 3, 2, 1) * 2.0, device="cpu")
    want = torch.nn.functional.max_pool2d(torch.relu(torch.from_numpy(x) + torch.from_numpy(b)), 3, 2, 1) * 2.0
    np.testing.assert_array_equal(f(x), want.numpy())


def test_gradient_and_other_dtypes_keep_their_forms():
    """A recorded gradient pools through the differentiable im2col form (the kernel has no gradient); float16 stays
    the strided-view chain. Both still match torch."""
    a = rand((1, 2, 9, 9), "float32", seed=5)
    x = plait.tensor(a, device="cpu", requires_grad=True)
    y = F.max_pool2d(x, 3, 2, 1)
    y.sum().backward()
    tx = torch.from_numpy(a).requires_grad_()
    torch.nn.functional.max_pool2d(tx, 3, 2, 1).sum().backward()
    np.testing.assert_array_equal(y.numpy(), torch.nn.functional.max_pool2d(torch.from_numpy(a), 3, 2, 1).numpy())
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
    h = a.astype(np.float16)
    got = F.max_pool2d(plait.tensor(h, device="cpu"), 3, 2, 1).numpy()
    np.testing.assert_array_equal(got, torch.nn.functional.max_pool2d(torch.from_numpy(h).float(), 3, 2, 1).numpy())


def test_pool_node_errors_name_the_way_out():
    geo = pool_c.PoolGeometry(1, 2, 9, 9, 3, 3, 2, 2, 1, 1, 1, 1, 5, 5)
    with pytest.raises(PlaitError, match="does not match the pooling geometry"):
        pool.max_pool2d(plait.tensor(rand((1, 2, 8, 9), "float32"), device="cpu").node, geo)
    with pytest.raises(PlaitError, match="float32 on the cpu device only"):
        pool.max_pool2d(plait.tensor(rand((1, 2, 9, 9), "float32").astype(np.float16), device="cpu").node, geo)
