"""The C GEMM's fringe columns on the `cpu` device: up to gemm_c.FRINGE_MAX columns past the last whole panel of the
register tile run as dot products along k (plait_fringe), with partial sums kept across k blocks, instead of one
more panel padded with zeros. Checked against NumPy in float64 and PyTorch on the shapes that take the path."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm, gemm_c
from tests.helpers import assert_close, rand, run_gemm_kernel


def _run(spec: gemm.GemmSpec, knobs: dict[str, int], a: np.ndarray, b: np.ndarray, out_shape) -> np.ndarray:
    batch, m, n = out_shape
    return run_gemm_kernel("cpu", gemm.render_c(spec, knobs), batch, m, n, a, b)


@pytest.mark.parametrize(
    "tile,fringe,m,k",
    [((8, 3), 1, 30, 21), ((8, 3), 4, 13, 600), ((6, 4), 2, 30, 600), ((6, 4), 3, 13, 21), ((24, 1), 3, 30, 600)],
)
def test_fringe_columns_match_numpy(tile, fringe, m, k):
    """Every fringe width on tiles whose rows are not a multiple of 4 (6, 24 rows; 30 and 13 rows of A), with one
    short k block (21: a 5-element tail past the 16-wide vectors) and three k blocks of 200 (partial sums carried)."""
    mr, nv = tile
    n = nv * gemm_c.VW + fringe
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))  # one image: a batch would merge its columns
    a, b = rand((m, k)), rand((1, k, n), seed=1)
    got = _run(spec, {"MR": mr, "NR": nv * gemm_c.VW}, a, b, (1, m, n))
    want = np.einsum("mk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))
    assert_close(got, want, "float32", f"gemm {mr}x{nv * gemm_c.VW} {m}x{n}x{k} fringe {fringe}", tol_scale=10)


def test_fringe_of_a_transposed_product():
    """A narrow C (5 columns) computed as C^T = B^T A^T, whose 49 columns (A's rows) end in a one-column fringe
    written with C's transposed strides."""
    m, n, k = 49, 5, 300
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, 0, n, 1))
    a, b = rand((m, k)), rand((k, n), seed=1)
    got = _run(spec, {"MR": 8, "NR": 48}, a, b, (1, m, n))
    assert_close(
        got[0], a.astype(np.float64) @ b.astype(np.float64), "float32", "transposed gemm 49x5x300", tol_scale=10
    )


def test_fringe_keeps_inf_and_nan_in_their_own_rows():
    """The dot products read no element past a row of A (the last k elements are copied into zeroed vectors, and
    rows past the block repeat the last one), so an inf or NaN in one row of A reaches only that row of C."""
    m, n, k = 13, 49, 37
    a, b = rand((m, k)), np.abs(rand((1, k, n), seed=1)) + 0.1
    a[11, k - 1], a[12, 0] = np.inf, np.nan
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    got = _run(spec, {"MR": 8, "NR": 48}, a, b, (1, m, n))[0]
    with np.errstate(invalid="ignore"):
        want = a.astype(np.float64) @ b[0].astype(np.float64)
    assert np.isposinf(got[11]).all()
    assert np.isnan(got[12]).all()
    assert_close(got[:11], want[:11], "float32", "gemm rows beside inf and NaN", tol_scale=10)


@pytest.mark.parametrize("cin,cout,k,stride,hw", [(40, 70, 1, 1, 7), (24, 33, 3, 2, 14), (16, 20, 1, 2, 27)])
def test_conv_with_fringe_matches_torch(cin, cout, k, stride, hw):
    """Convolutions whose output planes end in a fringe (7x7 = 48 + 1, 14x14 -> 7x7 strided, 27x27 -> 14x14 =
    192 + 4 columns), bias and ReLU fused, at batch 1, against PyTorch."""
    x = rand((1, cin, hw, hw))
    w, b = rand((cout, cin, k, k), seed=1) * 0.2, rand((cout,), seed=2)
    wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wt, bt, stride=stride, padding=k // 2).relu(), device="cpu")
    got = np.asarray(f(x))
    conv = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride, k // 2)
    assert_close(got, conv.relu().numpy(), "float32", f"conv {cin}->{cout} k{k} s{stride} {hw}x{hw}", tol_scale=10)
