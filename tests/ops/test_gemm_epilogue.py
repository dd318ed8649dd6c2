"""GEMM epilogue fusion: elementwise consumers of a matrix product run inside the GEMM kernel when they read the
product element for element; results must equal the unfused computation."""

import numpy as np
import pytest

import plait
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand


def _plan(fn, arrays, device):
    f = plait.jit(fn, device=device)
    got = f(*arrays)
    plan, _ = f.plan_for([np.asarray(a) for a in arrays])
    return got, plan


@pytest.mark.parametrize("m", [3, 37])  # the small-M (GEMV) path and the packed path
def test_bias_relu_residual_fuse_into_gemm(device, m):
    x, w, b, res = rand((m, 40)), rand((40, 24), seed=1), rand((24,), seed=2), rand((m, 24), seed=3)
    got, plan = _plan(lambda x, w, b, r: ((x @ w + b).relu() + r) * 0.5, [x, w, b, res], device)
    assert_close(got, (np.maximum(x @ w + b, 0) + res) * 0.5, "float32", "fused epilogue")
    assert [k.name.split("_")[0] for k in plan.kernels] in (["GEMM"], ["GEMV"], ["GEMM3XTF32"])


def test_batched_epilogue_with_reshape(device):
    x, w, b = rand((2, 5, 16)), rand((16, 9), seed=1), rand((9,), seed=2)
    got, plan = _plan(lambda x, w, b: (x @ w).reshape(10, 9).tanh() + b, [x, w, b], device)
    assert_close(got, np.tanh((x @ w).reshape(10, 9)) + b, "float32", "batched epilogue")
    assert len(plan.kernels) == 1


def test_no_fusion_when_product_is_read_twice_or_permuted(device):
    x, w = rand((6, 8)), rand((8, 6), seed=1)
    got, plan = _plan(lambda x, w: (x @ w) + (x @ w).T, [x, w], device)
    assert_close(got, x @ w + (x @ w).T, "float32", "permuted consumer")
    assert len(plan.kernels) >= 2  # the product is materialised, then read transposed
    got2, _plan2 = _plan(lambda x, w: [(x @ w).relu(), (x @ w).sum()], [x, w], device)
    assert_close(got2[0], np.maximum(x @ w, 0), "float32", "product with two readers")
    assert_close(got2[1], (x @ w).sum(), "float32", "product with two readers", tol_scale=10)


def test_product_that_is_an_output_is_kept(device):
    x, w = rand((7, 5)), rand((5, 3), seed=1)
    p = plait.tensor(x, device=device) @ plait.tensor(w, device=device)
    q = p.relu()
    plan = Plan([p.node, q.node])
    plan.run()
    assert len(plan.kernels) == 2


@pytest.mark.parametrize(
    ("sa", "sb", "extra"),
    [
        ((8, 8), (8, 1), (8, 1)),  # matrix-vector product with a per-row operand (the GEMV runs transposed)
        ((2, 4, 8, 8), (2, 4, 8, 1), (2, 4, 8, 1)),
        ((2, 4, 1, 8), (2, 4, 8, 8), (2, 4, 1, 8)),  # vector-matrix
        ((2, 4, 8, 1), (2, 4, 1, 8), (2, 4, 8, 8)),  # outer products
        ((6, 9, 5), (5, 1), (1, 9, 1)),  # per-row operand broadcast over the batch
        ((6, 9, 5), (5, 7), (9, 1)),
    ],
)
def test_epilogue_operand_indexed_by_output_coordinates(device, sa, sb, extra):
    """An extra epilogue operand must be read at the coordinates of the product element, whichever way the
    product's kernel walks it (transposed GEMV, narrow products, batches)."""
    a, b, e = rand(sa), rand(sb, seed=1), rand(extra, seed=2)
    got, _ = _plan(lambda a, b, e: e - (a @ b) * 0.5, [a, b, e], device)
    assert_close(got, e - (a @ b) * 0.5, "float32", f"epilogue operand {extra} of {sa} @ {sb}")
