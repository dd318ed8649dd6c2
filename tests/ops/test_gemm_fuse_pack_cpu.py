"""The C GEMM's packing of a row-contiguous B inside the first row block's micro-kernels (gemm_c.FUSE_PACK): a task
that packs its own panels reads its whole panels from B in place in its first row block, storing each row into the
packed panel as it goes, and the later row blocks read that panel. Checked against NumPy in float64 and, bit for bit,
against the same kernel rendered with FUSE_PACK off (the sums run in the same order): several k blocks (the first
row block packs every block again), a partial first row block, a partial last panel packed apart, a batch of
products that each pack their own B, B rows longer than the columns used (a row stride past n), one thread and
two."""

import ctypes

import numpy as np
import pytest

from plait.codegen import gemm, gemm_c
from tests.helpers import assert_close, rand, run_gemm_kernel

_GOMP = ctypes.CDLL("libgomp.so.1")


def _run(spec, tile, a, b, threads):
    mr, nv = tile
    before = _GOMP.omp_get_max_threads()
    _GOMP.omp_set_num_threads(threads)
    try:
        kern = gemm.render_c(spec, {"MR": mr, "NR": nv * gemm_c.VW})
        return run_gemm_kernel("cpu", kern, spec.batch, spec.m, spec.n, a, b)
    finally:
        _GOMP.omp_set_num_threads(before)


def test_fused_packing_kernel_is_in_the_library():
    assert gemm_c.FUSE_PACK
    spec = gemm.GemmSpec(1, 64, 784, 256, (0, 0, 256, 1), (0, 0, 784, 1))
    mr, nv = gemm_c.pick_tile(spec.m, spec.n)  # 8x3 with 16-float vectors
    assert f"plait_micro_pk_{mr}x{nv}(" in gemm_c.library(mr, nv)
    assert f"plait_micro_pk_{mr}x{nv}(" in gemm.render_c(spec, {}).source


@pytest.mark.parametrize("tile", [(8, 3), (6, 4), (12, 2)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "batch,m,n,k,ldb",
    [
        (1, 64, 784, 600, 784),  # three k blocks; 784 = 16 panels of 48 + a 16-column tail
        (1, 37, 1000, 130, 1000),  # a partial row block; 1000 = 20 x 48 + 40
        (2, 20, 3136, 64, 3136),  # two products, one B each, packed by their own tasks
        (1, 16, 600, 96, 640),  # B's rows 640 apart, 600 of them used
    ],
    ids=["3-k-blocks", "partial-rows", "batch-2", "row-stride"],
)
def test_fused_packing_matches_numpy_and_the_separate_packing(tile, threads, batch, m, n, k, ldb, monkeypatch):
    spec = gemm.GemmSpec(batch, m, n, k, (0, 0, k, 1), (0, k * ldb, ldb, 1))
    a = rand((m, k))
    b = rand((batch, k, ldb), seed=1)
    got = _run(spec, tile, a, b, threads)
    for bz in range(batch):
        want = a.astype(np.float64) @ b[bz, :, :n].astype(np.float64)
        assert_close(got[bz], want, "float32", f"fused packing {tile} {m}x{n}x{k} image {bz}", tol_scale=10)
    monkeypatch.setattr(gemm_c, "FUSE_PACK", False)
    apart = _run(spec, tile, a, b, threads)
    assert np.array_equal(got, apart), "the fused packing must compute what the separate packing does, bit for bit"
