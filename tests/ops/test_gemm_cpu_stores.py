"""How the C GEMM's micro-kernel stores its tile on the `cpu` device: a whole tile from the accumulators, a partial
or transposed one (C^T = B^T A^T for a narrow C) through a tile on the stack, in every case also adding to C after
the first k block. Checked against NumPy in float64 on every register tile."""

import ctypes

import numpy as np
import pytest

from plait.codegen import gemm, gemm_c
from tests.helpers import assert_close, rand, run_gemm_kernel


@pytest.mark.parametrize("tile", gemm_c.TILES)
@pytest.mark.parametrize("m,n,k", [(48, 96, 600), (37, 53, 600)])
def test_tiles_whole_and_partial_over_k_blocks(tile, m, n, k):
    """Whole tiles (48 x 96) and partial ones in both directions (37 x 53), over three k blocks of 200."""
    mr, nv = tile
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    a, b = rand((m, k)), rand((k, n), seed=1)
    got = run_gemm_kernel("cpu", gemm.render_c(spec, {"MR": mr, "NR": nv * gemm_c.VW}), 1, m, n, a, b[None])
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(got[0], want, "float32", f"gemm {mr}x{nv * gemm_c.VW} {m}x{n}x{k}", tol_scale=10)


@pytest.mark.parametrize("m", [48, 45])
def test_transposed_tiles_over_k_blocks(m):
    """A narrow C (7 columns) computed transposed, stored with C's strides element by element; k past one narrow
    block (KC_NARROW) so that the second block adds to what the first stored."""
    n, k = 7, gemm_c.KC_NARROW + 100
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, 0, n, 1))
    a, b = rand((m, k)), rand((k, n), seed=1)
    got = run_gemm_kernel("cpu", gemm.render_c(spec, {"MR": 8, "NR": 48}), 1, m, n, a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(got[0], want, "float32", f"transposed gemm {m}x{n}x{k}", tol_scale=10)


_GOMP = ctypes.CDLL("libgomp.so.1")


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize(
    "m,n,k",
    [(32, 66 * 48, 20), (96, 196, 40), (40, 49, 30)],
    ids=["column-tasks-added", "row-tasks-added", "rows-split"],
)
def test_task_counts_for_the_threads(threads, m, n, k):
    """Task counts rounded to a multiple of the threads: 66 panels in 10 column tasks instead of 9, a 196-column
    product in 3 x 4 instead of 3 x 3 tasks (rows split), and a 49-column one split by rows only."""
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    a, b = rand((m, k)), rand((k, n), seed=1)
    before = _GOMP.omp_get_max_threads()
    _GOMP.omp_set_num_threads(threads)
    try:
        got = run_gemm_kernel("cpu", gemm.render_c(spec, {"MR": 8, "NR": 48}), 1, m, n, a, b[None])
    finally:
        _GOMP.omp_set_num_threads(before)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert_close(got[0], want, "float32", f"gemm {m}x{n}x{k} on {threads} threads", tol_scale=10)
