"""The scatter_rows and topk_rows kernels against NumPy, on every device."""

import numpy as np
import pytest

import plait
from plait.errors import ShapeError
from plait.frontends.native.tensor import Tensor
from plait.graph.ops.scatter import scatter_rows, topk_rows

_NP = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reference(data: np.ndarray, index: np.ndarray, updates: np.ndarray, reduction: str) -> np.ndarray:
    out = data.copy()
    for row, (idx, upd) in enumerate(zip(index, updates, strict=True)):
        for i, u in zip(idx, upd, strict=True):
            if 0 <= i < out.shape[1]:
                out[row, i] = u if reduction == "none" else _NP[reduction](out[row, i], u)
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_scatter_rows(device, reduction, dtype):
    rng = np.random.default_rng(0)
    data = rng.integers(-5, 5, (3, 40)).astype(dtype)
    index = rng.integers(-2, 42, (3, 70)).astype(np.int64)  # duplicates, and positions out of range (skipped)
    updates = rng.integers(-5, 5, (3, 70)).astype(dtype)
    t = [plait.tensor(a, device=device) for a in (data, index, updates)]
    got = Tensor(scatter_rows(t[0].node, t[1].node, t[2].node, reduction)).numpy()
    np.testing.assert_array_equal(got, _reference(data, index, updates, reduction))


@pytest.mark.parametrize("largest", [True, False])
def test_topk_rows(device, largest):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 6, (5, 33)).astype(np.float32)  # many ties: the lower position comes first
    got = Tensor(topk_rows(plait.tensor(x, device=device).node, 7, largest)).numpy()
    want = np.argsort(-x if largest else x, axis=1, kind="stable")[:, :7]
    np.testing.assert_array_equal(got, want)


def test_topk_rows_nan_ranks_first(device):
    x = np.array([[1.0, np.nan, 3.0, 2.0]], np.float32)
    got = Tensor(topk_rows(plait.tensor(x, device=device).node, 4, True)).numpy()
    np.testing.assert_array_equal(got, [[1, 2, 3, 0]])


def test_bad_shapes_raise():
    d = plait.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(ShapeError, match="scatter_rows"):
        scatter_rows(d.node, d.reshape(3, 2).node, d.node)
    with pytest.raises(ShapeError, match="topk_rows"):
        topk_rows(d.node, 4)
