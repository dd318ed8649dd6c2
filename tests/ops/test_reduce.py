"""Reductions against NumPy on every device: any axes, keepdims, dtypes, NaN, empty axes, large (split) reductions."""

import numpy as np
import pytest

import plait
from tests.helpers import assert_close, rand

AXES = [None, 0, 1, -1, (0, 2), (1, 2), (0, 1, 2)]


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_float_reductions_over_axes(device, op):
    a = rand((3, 4, 5), "float32", seed=1)
    t = plait.tensor(a, device=device)
    for keepdims in (False, True):
        for axis in AXES if keepdims else AXES[:4]:
            got = getattr(t, op)(axis=axis, keepdims=keepdims)
            want = getattr(np, op)(a, axis=axis, keepdims=keepdims)
            assert_close(got.numpy(), want, "float32", f"{op} axis={axis} keepdims={keepdims} on {device}")


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool", "float16"])
def test_reductions_per_dtype(device, dtype):
    a = rand((4, 6), dtype, seed=2)
    t = plait.tensor(a, device=device)
    for op in ("sum", "max", "min", "prod", "mean"):
        if op == "prod" and dtype == "float16":
            continue
        got = getattr(t, op)(axis=1)
        want = getattr(np, op)(a, axis=1)
        if want.dtype == np.float64:
            want = want.astype(np.float32)
        assert got.dtype.name == str(want.dtype), f"{op} of {dtype}: {got.dtype} vs {want.dtype}"
        tol = dtype if op != "mean" else ("float16" if dtype == "float16" else "float32")
        assert_close(got.numpy(), want, tol, f"{op} of {dtype} on {device}")


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_argmax_argmin(device, dtype):
    a = rand((4, 7), dtype, seed=3)
    if dtype == "float32":
        a[1, 2] = a[1, 5] = a[1].max() + 1  # ties: the first index wins
    t = plait.tensor(a, device=device)
    for f in ("argmax", "argmin"):
        for axis in (0, 1, -1, None):
            got = getattr(t, f)(axis=axis)
            want = getattr(np, f)(a, axis=axis)
            assert got.dtype is plait.int64
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{f} axis={axis} {dtype}")
        np.testing.assert_array_equal(getattr(t, f)(axis=0, keepdims=True).numpy(), getattr(np, f)(a, 0, keepdims=True))


def test_nan_propagates(device):
    a = rand((3, 40), "float32", seed=4)
    a[1, 17] = np.nan
    t = plait.tensor(a, device=device)
    got = plait.stack([t.max(axis=1), t.min(axis=1), t.sum(axis=1)]).numpy()
    want = np.stack([a.max(axis=1), a.min(axis=1), a.sum(axis=1)])
    assert_close(got, want, "float32", "NaN in max/min/sum")
    np.testing.assert_array_equal(t.argmax(axis=1).numpy(), a.argmax(axis=1))


def test_large_reductions_are_split_and_still_exact(device):
    n = 70000
    a = rand((n,), "float32", seed=5)
    ai = np.arange(n, dtype=np.int64) % 1000 - 500
    t, ti = plait.tensor(a, device=device), plait.tensor(ai, device=device)
    assert_close(t.sum().numpy(), a.astype(np.float64).sum().astype(np.float32), "float32", "big sum", 10)
    assert t.max().item() == a.max() and t.min().item() == a.min()
    assert ti.sum().item() == ai.sum()
    a[n - 3] = np.nan
    assert np.isnan(plait.tensor(a, device=device).max().item())


def test_empty_reductions(device):
    e = plait.tensor(np.zeros((0, 3), np.float32), device=device)
    np.testing.assert_array_equal(e.sum(axis=0).numpy(), np.zeros(3, np.float32))
    np.testing.assert_array_equal(e.prod(axis=0).numpy(), np.ones(3, np.float32))
    assert np.isnan(e.mean(axis=0).numpy()).all()
    assert e.sum(axis=1).numpy().shape == (0,)
    with pytest.raises(plait.ShapeError, match="empty"):
        e.max(axis=0)


def test_reduction_of_a_fused_expression_and_of_views(device):
    a = rand((5, 6), "float32", seed=6)
    t = plait.tensor(a, device=device)
    cases = [
        (((t * 2 + 1).exp()).sum(axis=0), np.exp(a * 2 + 1).sum(axis=0)),
        (t.T.max(axis=1), a.T.max(axis=1)),
        (t[::-1, ::2].reshape(3, 5).mean(axis=0), a[::-1, ::2].reshape(3, 5).mean(axis=0)),
    ]
    for i, (got, want) in enumerate(cases):
        assert_close(got.numpy(), want, "float32", f"reduction {i} of an expression or view on {device}")


def test_mean_over_inner_axes_of_a_fused_expression(device):
    """A global average pool's shape of reduction (the innermost axes, read at one linear index) over an expression
    mixing full-size operands, a transposed view and a per-channel broadcast, as a network's head fuses them."""
    x, res = rand((3, 8, 5, 7), "float32", seed=7), rand((3, 8, 7, 5), "float32", seed=8)
    scale, shift = rand((8, 1, 1), "float32", seed=9), rand((8, 1, 1), "float32", seed=10)
    t, r = plait.tensor(x, device=device), plait.tensor(res, device=device)
    s, b = plait.tensor(scale, device=device), plait.tensor(shift, device=device)
    pre = x * scale + shift + res.transpose(0, 1, 3, 2)
    cases = [
        ((t * s + b + r.permute(0, 1, 3, 2)).relu().mean(axis=(2, 3)), np.maximum(pre, 0).mean(axis=(2, 3))),
        ((t * s + b).sum(axis=(1, 2, 3)), (x * scale + shift).sum(axis=(1, 2, 3))),
        ((t * s).max(axis=-1, keepdims=True), (x * scale).max(axis=-1, keepdims=True)),
    ]
    for i, (got, want) in enumerate(cases):
        assert_close(got.numpy(), want, "float32", f"inner-axes reduction {i} on {device}")
