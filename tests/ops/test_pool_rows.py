"""Short reductions written out term by term and outputs looped as rows: a max pool built as a stack of strided
views reduced over the stack axis (how ONNX MaxPool lowers), NaN propagation through it, sums, products and minima
over short axes, and an elementwise pooling chain, against NumPy and PyTorch on every device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
from plait.frontends.native.tensor import stack
from tests.helpers import assert_close, rand


def _separable_max_pool(x: plait.Tensor, k: int, s: int) -> plait.Tensor:
    """Max pooling one spatial axis at a time over a stack of k strided views (no padding)."""
    y = x
    for ax in (2, 3):
        n = (y.shape[ax] - k) // s + 1
        views = [y[(slice(None),) * ax + (slice(o, o + (n - 1) * s + 1, s),)] for o in range(k)]
        y = stack(views, -1).max(axis=-1)
    return y


@pytest.mark.parametrize("shape", [(1, 4, 23, 31), (2, 3, 9, 5)])
def test_stacked_view_max_pool_matches_torch(device, shape):
    """The pool with a fused input expression (a convolution's bias + ReLU), and NaN propagating through it."""
    a = rand(shape, "float32", seed=3)
    bias = rand((shape[1], 1, 1), "float32", seed=4)
    tx, tb = plait.tensor(a, device=device), plait.tensor(bias, device=device)
    got = _separable_max_pool((tx + tb).relu(), 3, 2)
    want = torch.nn.functional.max_pool2d(torch.relu(torch.from_numpy(a) + torch.from_numpy(bias)), 3, 2)
    assert_close(got.numpy(), want.numpy(), "float32", f"stacked max pool {shape} on {device}")
    a[0, 1, 4, 3] = np.nan
    got = _separable_max_pool(plait.tensor(a, device=device) + tb, 3, 2)
    want = torch.nn.functional.max_pool2d(torch.from_numpy(a) + torch.from_numpy(bias), 3, 2)
    assert_close(got.numpy(), want.numpy(), "float32", f"stacked max pool with NaN {shape} on {device}")


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize(("shape", "axis"), [((6, 5, 40, 3), 3), ((6, 7, 33), 1), ((3, 4, 2, 50), (1, 2))])
def test_short_reductions_over_rows(device, op, shape, axis):
    a = rand(shape, "float32", seed=5) * (0.5 if op == "prod" else 1.0)
    got = getattr(plait.tensor(a, device=device), op)(axis=axis)
    assert_close(got.numpy(), getattr(np, op)(a, axis=axis), "float32", f"{op} over {axis} of {shape} on {device}")


@pytest.mark.parametrize("dtype", ["int32", "float16"])
def test_short_reductions_per_dtype(device, dtype):
    a = rand((5, 3, 20), dtype, seed=6)
    t = plait.tensor(a, device=device)
    for op in ("sum", "max", "min"):
        want = getattr(np, op)(a, axis=1)
        assert_close(getattr(t, op)(axis=1).numpy(), want, dtype, f"{op} of {dtype} on {device}")


def test_elementwise_pool_chain_matches_torch(device):
    """F.max_pool2d (an elementwise max over strided views) with padding: row loops with clamped loads."""
    a = rand((2, 3, 17, 19), "float32", seed=7)
    got = plait.nn.functional.max_pool2d(plait.tensor(a, device=device), 3, 2, 1)
    want = torch.nn.functional.max_pool2d(torch.from_numpy(a), 3, 2, 1)
    assert_close(got.numpy(), want.numpy(), "float32", f"max_pool2d on {device}")


def test_cpu_kernels_loop_rows_and_unroll_short_reductions():
    """On cpu the stacked-view pool's kernels loop over rows with an inner vector loop and no reduction loop."""
    a = rand((1, 4, 23, 31), "float32", seed=8)
    f = plait.jit(lambda x: _separable_max_pool(x, 3, 2), device="cpu")
    plan, _ = f.plan_for([a])
    sources = [k.source for k in plan.kernels]
    assert sources and all("for (int j = 0; j <" in s for s in sources), sources
    assert not any("reduction(max" in s for s in sources), sources


@pytest.mark.parametrize("op", ["max", "min"])
def test_short_reductions_propagate_nan(device, op):
    """A NaN anywhere in a short (unrolled) reduction wins, first term included, as in NumPy; infinities do not."""
    a = rand((4, 6, 20), "float32", seed=9)
    a[0, 0, 3] = np.nan
    a[1, 2, 5] = np.nan
    a[2, 5, 7] = np.nan
    a[3, 1, 9] = np.inf
    a[3, 4, 9] = -np.inf
    got = getattr(plait.tensor(a, device=device), op)(axis=1).numpy()
    assert_close(got, getattr(np, op)(a, axis=1), "float32", f"{op} with NaN on {device}")
