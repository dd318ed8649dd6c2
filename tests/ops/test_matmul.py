"""matmul against NumPy: 1-d operands, broadcast batch dims, transposed views, odd sizes, K=0, every dtype."""

import numpy as np
import pytest

import plait
from tests.helpers import assert_close, rand

CASES = [
    ((1, 1), (1, 1)),
    ((17, 65), (65, 33)),
    ((5,), (5,)),
    ((5,), (5, 3)),
    ((4, 5), (5,)),
    ((2, 1, 3, 5), (4, 5, 2)),
    ((3, 0), (0, 4)),
    ((0, 3), (3, 2)),
    ((2, 3, 7), (7, 1)),
]


@pytest.mark.parametrize(("sa", "sb"), CASES)
def test_matmul_shapes(device, sa, sb):
    a, b = rand(sa, seed=1), rand(sb, seed=2)
    got = plait.tensor(a, device=device) @ plait.tensor(b, device=device)
    want = a @ b
    assert got.shape == want.shape
    assert_close(got.numpy(), want, "float32", f"{sa} @ {sb} on {device}", tol_scale=10)


def test_transposed_and_sliced_operands(device):
    a, b = rand((6, 9), seed=3), rand((4, 6), seed=4)
    ta, tb = plait.tensor(a, device=device), plait.tensor(b, device=device)
    assert_close((tb @ ta).numpy(), b @ a, "float32", "plain")
    assert_close((ta.T @ tb.T).numpy(), a.T @ b.T, "float32", "both transposed")
    assert_close((ta[::2, 1:].T @ tb.T[::2]).numpy(), a[::2, 1:].T @ b.T[::2], "float32", "strided")
    x = rand((3, 4, 5), seed=5)
    tx = plait.tensor(x, device=device)
    got = tx.permute(1, 0, 2)[..., :3] @ tx.permute(1, 2, 0)[:, :3]
    assert_close(got.numpy(), x.transpose(1, 0, 2)[..., :3] @ x.transpose(1, 2, 0)[:, :3], "float32", "permuted batch")
    assert_close(
        (tx * 2 + 1).transpose(-1, -2).matmul(tx).numpy(), (x * 2 + 1).swapaxes(-1, -2) @ x, "float32", "fused"
    )


@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "bool"])
def test_matmul_dtypes(device, dtype):
    a, b = rand((3, 4), dtype, seed=6), rand((2, 4, 5), dtype, seed=7)
    got = plait.tensor(a, device=device) @ plait.tensor(b, device=device)
    want = a @ b
    assert got.dtype.name == str(want.dtype)
    assert_close(got.numpy(), want, dtype, f"{dtype} matmul on {device}")


def test_mixed_dtype_matmul_promotes(device):
    a, b = rand((3, 4), "int32", seed=8), rand((4, 2), "float32", seed=9)
    got = plait.tensor(a, device=device) @ plait.tensor(b, device=device)
    assert got.dtype is plait.float32
    assert_close(got.numpy(), (a @ b).astype(np.float32), "float32", "int32 @ float32")
