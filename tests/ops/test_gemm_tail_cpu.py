"""The C GEMM's last, partial panel of at most TAIL_VECTORS vectors of columns runs on a narrower micro-kernel
(plait_micro_{mr}x1of{nv}) that reads the same packed panel, instead of the whole register tile multiplying zero
columns: a 784-column product (28x28, resnet50's layer 2) ends in 16 columns of a 48-wide tile. Checked against
NumPy in float64: tails of exactly one vector (the whole-tile store) and fewer columns (stored through the stack),
after several k blocks (adding to C), transposed (C^T stored with C's strides), on one thread and two, and inside
a residual block whose residual is carried in C (adding to it)."""

import ctypes

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm, gemm_c
from tests.helpers import assert_close, rand, run_gemm_kernel

_GOMP = ctypes.CDLL("libgomp.so.1")


def test_tail_kernels_are_in_the_library():
    assert gemm_c.TAIL_VECTORS >= 1
    assert "plait_micro_8x1of3(" in gemm_c.library(8, 3)
    assert "plait_micro_6x1of4(" in gemm_c.library(6, 4)


@pytest.mark.parametrize("tile", [(8, 3), (6, 4), (12, 2)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "m,n,k",
    [(40, 784, 64), (37, 3 * 48 + 9, 600), (16, 2 * 64 + 16, 300)],
    ids=["784-columns", "9-column-tail-3-k-blocks", "16-column-tail"],
)
def test_partial_last_panel_matches_numpy(tile, threads, m, n, k):
    mr, nv = tile
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    a, b = rand((m, k)), rand((k, n), seed=1)
    before = _GOMP.omp_get_max_threads()
    _GOMP.omp_set_num_threads(threads)
    try:
        got = run_gemm_kernel("cpu", gemm.render_c(spec, {"MR": mr, "NR": nv * gemm_c.VW}), 1, m, n, a, b[None])
    finally:
        _GOMP.omp_set_num_threads(before)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(got[0], want, "float32", f"gemm {mr}x{nv * gemm_c.VW} {m}x{n}x{k}", tol_scale=10)


def test_transposed_tail_matches_numpy():
    """A narrow C (5 columns) computed transposed: C's 58 rows are the panels' columns, 48 + a 10-column tail."""
    m, n, k = 58, 5, 300
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, 0, n, 1))
    a, b = rand((m, k)), rand((k, n), seed=1)
    got = run_gemm_kernel("cpu", gemm.render_c(spec, {"MR": 8, "NR": 48}), 1, m, n, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(got[0], want, "float32", f"transposed gemm {m}x{n}x{k}", tol_scale=10)


def test_residual_block_at_28x28_matches_torch():
    """relu(conv1x1(relu(conv1x1(r))) + b + r) over a 28x28 plane: the last product adds to the residual carried in
    C, 784 columns ending in a 16-column tail."""
    x = rand((1, 32, 28, 28), low=-1, high=1)
    w0, w1 = rand((64, 32, 1, 1), seed=1) * 0.2, rand((32, 64, 1, 1), seed=2) * 0.2
    w2, b2 = rand((64, 32, 1, 1), seed=3) * 0.2, rand((64,), seed=4)
    pw = [plait.tensor(v, device="cpu") for v in (w0, w1, w2, b2)]

    def block(t, conv, relu, ws):
        r = relu(conv(t, ws[0]))
        y = relu(conv(relu(conv(r, ws[1])), ws[2], ws[3]) + r)
        return conv(y, ws[1])

    f = plait.jit(lambda t: block(t, F.conv2d, F.relu, pw), device="cpu")
    got = np.asarray(f(x))
    tw = [torch.from_numpy(v) for v in (w0, w1, w2, b2)]
    want = block(torch.from_numpy(x), torch.nn.functional.conv2d, torch.relu, tw).numpy()
    assert_close(got, want, "float32", "residual block 28x28", tol_scale=10)
