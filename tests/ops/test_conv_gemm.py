"""Convolution and GEMM on the `cpu` device's C GEMM library: implicit-GEMM convolutions (patches gathered while
packing, no im2col buffer) with fused epilogues, and plain GEMMs over the register-tile shapes and tail cases,
against PyTorch."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm, gemm_c
from plait.runtime import get_device
from tests.helpers import assert_close, rand

GEOMETRIES = [  # n, c, h, w, co, kh, kw, stride, padding, dilation, groups
    (1, 3, 17, 15, 8, 3, 3, 1, 1, 1, 1),
    (2, 5, 11, 9, 13, 3, 3, 2, 1, 1, 1),
    (1, 4, 13, 13, 30, 7, 7, 2, 3, 1, 1),
    (3, 6, 8, 10, 9, 3, 2, (2, 1), (0, 1), (2, 1), 3),
    (2, 8, 7, 7, 40, 1, 1, 2, 0, 1, 1),
    (1, 16, 7, 7, 33, 3, 3, 1, 1, 1, 1),
    (2, 4, 6, 6, 12, 3, 3, 1, 2, 2, 2),
    (2, 6, 9, 11, 6, 3, 3, 1, 1, 1, 6),  # depthwise
    (1, 5, 14, 13, 5, 3, 3, 2, 1, 1, 5),
    (1, 3, 10, 10, 3, 5, 3, (2, 1), (2, 0), (1, 2), 3),
    (2, 4, 15, 12, 4, 5, 5, 2, 2, 1, 4),  # depthwise, strided
    (1, 3, 16, 17, 3, 3, 3, 3, 1, 1, 3),
]


def _conv_plan(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride, padding, dilation, groups):
    def fn(t):
        out = F.conv2d(
            t, plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu"), stride, padding, dilation, groups
        )
        return out.relu()

    jit = plait.jit(fn, device="cpu")
    plan, _ = jit.plan_for([x])
    return jit, plan


@pytest.mark.parametrize("geo", GEOMETRIES)
def test_implicit_conv_matches_torch(geo):
    n, c, h, w, co, kh, kw, stride, padding, dilation, groups = geo
    x, wt, b = rand((n, c, h, w)), rand((co, c // groups, kh, kw), seed=1), rand((co,), seed=2)
    jit, plan = _conv_plan(x, wt, b, stride, padding, dilation, groups)
    ref = torch.nn.functional.conv2d(
        torch.tensor(x), torch.tensor(wt), torch.tensor(b), stride, padding, dilation, groups
    ).relu()
    assert_close(jit(x), ref.numpy(), "float32", f"conv2d {geo}", tol_scale=10)
    kinds = [k.name.split("_")[0] for k in plan.kernels]
    if groups == c == co:
        assert kinds == ["DWCONV"]  # the dedicated depthwise kernel, bias + ReLU in its epilogue
    elif co // groups > 4 and (kh, kw) != (1, 1):
        # the patches are gathered by the GEMM itself and bias + ReLU run in its epilogue: one kernel
        assert kinds == ["CONV"]


def test_training_keeps_the_patch_buffer():
    """The weight gradient reads the same patch columns, so in training im2col stays a buffer and still agrees."""
    x, wt = rand((2, 3, 9, 9)), rand((8, 3, 3, 3), seed=1)
    xp = plait.tensor(x, device="cpu", requires_grad=True)
    wp = plait.tensor(wt, device="cpu", requires_grad=True)
    F.conv2d(xp, wp, padding=1).sum().backward()
    xt, wtt = torch.tensor(x, requires_grad=True), torch.tensor(wt, requires_grad=True)
    torch.nn.functional.conv2d(xt, wtt, padding=1).sum().backward()
    assert xp.grad is not None and wp.grad is not None
    assert_close(wp.grad.numpy(), wtt.grad.numpy(), "float32", "conv2d weight gradient", tol_scale=10)
    assert_close(xp.grad.numpy(), xt.grad.numpy(), "float32", "conv2d input gradient", tol_scale=10)


@pytest.mark.parametrize(
    "m,n,k",
    [(1, 7, 5), (5, 1, 9), (24, 16, 300), (25, 33, 257), (100, 37, 70), (64, 3, 20), (7, 300, 5), (130, 49, 513)],
)
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_gemm_shapes(m, n, k, transpose_a, transpose_b):
    """Every register tile, the transposed-product paths (narrow C; B stored transposed as a linear weight) and
    the matrix-vector path, with operands stored either way round."""
    a = rand((k, m) if transpose_a else (m, k))
    b = rand((n, k) if transpose_b else (k, n), seed=1)
    at, bt = plait.tensor(a, device="cpu"), plait.tensor(b, device="cpu")
    got = ((at.T if transpose_a else at) @ (bt.T if transpose_b else bt)).numpy()
    want = (a.T if transpose_a else a) @ (b.T if transpose_b else b)
    assert_close(got, want, "float32", f"matmul {m}x{n}x{k}", tol_scale=10)


def test_pick_tile_follows_measured_costs():
    """The heuristic's choices on the pointwise products where bench_tiles_c.py measured the winners: the 3- and
    4-vector tiles, never 24x16 on 196 columns although it pads least; 49 columns as one 48-wide panel and one
    fringe column of dot products (plait_fringe) rather than a 64-wide panel padded with 15 zero columns. With
    8- or 4-float vectors (16 registers) the two-vector 6x2 tile, the fastest alone, wins all four."""
    if gemm_c.VW != 16:
        for m, n in [(64, 3136), (1024, 196), (96, 196), (512, 49)]:
            assert gemm_c.pick_tile(m, n) == (6, 2)
        return
    assert gemm_c.pick_tile(64, 3136) in {(8, 3), (6, 4)}
    assert gemm_c.pick_tile(1024, 196) == (8, 3)
    assert gemm_c.pick_tile(96, 196) == (8, 3)
    assert gemm_c.pick_tile(512, 49) == (8, 3)


@pytest.mark.parametrize("tile", gemm_c.TILES)
@pytest.mark.parametrize("batch,m,n,k", [(1, 25, 49, 16), (2, 30, 196, 70), (1, 7, 600, 300)])
def test_every_tile_matches_numpy(tile, batch, m, n, k):
    """Each register tile, forced through the MR/NR knobs, on a 1x1-convolution-shaped product (the weight shared
    over a batch of (k, n) image planes) with row, column and k tails, against NumPy in float64."""
    dev = get_device("cpu")
    mr, nv = tile
    spec = gemm.GemmSpec(batch, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    kern = gemm.render_c(spec, {"MR": mr, "NR": nv * gemm_c.VW})
    a, b = rand((m, k)), rand((batch, k, n), seed=1)
    bufs = [dev.allocator.alloc(4 * size) for size in (batch * m * n, m * k, batch * k * n)]
    dev.allocator.copy_in(bufs[1], a)
    dev.allocator.copy_in(bufs[2], b)
    dev.compile(kern.source, kern.name).bind(bufs, kern.global_size, kern.local_size)()
    got = np.empty((batch, m, n), np.float32)
    dev.allocator.copy_out(bufs[0], got)
    want = np.einsum("mk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))
    assert_close(got, want, "float32", f"gemm tile {mr}x{nv * gemm_c.VW} {batch}x{m}x{n}x{k}", tol_scale=10)


@pytest.mark.parametrize("batch,m,n,k", [(3, 30, 49, 70), (5, 7, 13, 9), (2, 40, 600, 33)])
def test_batched_gemm_with_shared_weights(batch, m, n, k):
    """One weight matrix against a batch of narrow operands: the columns of all batch entries form one product."""
    a, b = rand((m, k)), rand((batch, k, n), seed=1)
    got = (plait.tensor(a, device="cpu") @ plait.tensor(b, device="cpu")).relu().numpy()
    assert_close(got, np.maximum(a @ b, 0), "float32", f"batched matmul {batch}x{m}x{n}x{k}", tol_scale=10)
