"""The `cpu` device's few-rows product (C GEMV, plait_sgemv): B as dot-product columns (a linear layer's weight,
contiguous along K), as rows contiguous along N (an exported, pre-transposed weight), and strided; one to four rows,
and up to 16 against a B too large for cache (K chunks, row blocks), K and N not multiples of the vector width,
batches, a strided A, and fused epilogues through whole linear layers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
from plait.codegen.gemm import GemmSpec, render_c
from tests.helpers import assert_close, run_gemm_kernel

# (batch, m, n, k, layout of B): "dot" = (n, k) row-major read as B^T, "rows" = (k, n), "strided" = (k, 2n) halves
CASES = [
    (1, 1, 37, 64, "dot"),
    (1, 1, 1000, 257, "dot"),
    (2, 3, 20, 37, "dot"),
    (1, 4, 9, 17, "dot"),
    (1, 1, 1003, 130, "rows"),
    (3, 2, 70, 9, "rows"),
    (1, 4, 2600, 7, "rows"),
    (1, 1, 33, 40, "strided"),
    (2, 3, 300, 21, "strided"),
    # up to 16 rows against a B of a million elements or more (a linear layer at batch 16): weight-streaming GEMV
    (1, 16, 1030, 1021, "dot"),
    (1, 9, 501, 2100, "dot"),
    (1, 16, 1100, 1000, "rows"),
    (1, 13, 1001, 1049, "rows"),
]


def _b_operand(b: np.ndarray, layout: str) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    batch, k, n = b.shape
    if layout == "dot":
        return np.ascontiguousarray(b.transpose(0, 2, 1)), (0, k * n, 1, k)
    if layout == "rows":
        return b, (0, k * n, n, 1)
    wide = np.zeros((batch, k, 2 * n), np.float32)
    wide[:, :, ::2] = b
    return wide, (0, 2 * k * n, 2 * n, 2)


@pytest.mark.parametrize(("batch", "m", "n", "k", "layout"), CASES)
def test_gemv_matches_float64(batch, m, n, k, layout):
    rng = np.random.default_rng(m * 100 + n + k)
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    bm, sb = _b_operand(b, layout)
    kern = render_c(GemmSpec(batch, m, n, k, (0, m * k, k, 1), sb))
    assert kern.name.startswith("GEMV_"), kern.name
    got = run_gemm_kernel("cpu", kern, batch, m, n, a, bm)
    assert_close(got, np.matmul(a.astype(np.float64), b.astype(np.float64)), "float32", kern.name, tol_scale=10)


@pytest.mark.parametrize("layout", ["dot", "rows"])
def test_gemv_with_strided_a(layout):
    """A read with a column stride (A^T of a row-major matrix): the dot path packs its rows first."""
    rng = np.random.default_rng(7)
    m, n, k = 3, 50, 45
    at = rng.standard_normal((k, m), dtype=np.float32)  # A = at.T, so A[i, p] sits at p * m + i
    b = rng.standard_normal((1, k, n), dtype=np.float32)
    bm, sb = _b_operand(b, layout)
    kern = render_c(GemmSpec(1, m, n, k, (0, 0, 1, m), sb))
    assert kern.name.startswith("GEMV_"), kern.name
    got = run_gemm_kernel("cpu", kern, 1, m, n, at, bm)
    assert_close(got, (at.T.astype(np.float64) @ b[0].astype(np.float64))[None], "float32", kern.name, tol_scale=10)


@pytest.mark.parametrize(("rows", "outs", "ins"), [(1, 130, 300), (2, 130, 300), (16, 1030, 1020)])
@pytest.mark.parametrize("pretransposed", [False, True])
def test_linear_layer_with_epilogue(rows, outs, ins, pretransposed):
    """A linear layer (bias + ReLU fused into the GEMV's epilogue), with the weight as (out, in) read transposed
    and as an (in, out) matrix, as ONNX exports store it; 16 rows stream a weight of a million elements."""
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, ins), dtype=np.float32)
    w = rng.standard_normal((outs, ins), dtype=np.float32) * 0.1
    bias = rng.standard_normal(outs, dtype=np.float32)
    wt = np.ascontiguousarray(w.T)

    def net(x: plait.Tensor, w: plait.Tensor, bias: plait.Tensor) -> plait.Tensor:
        return ((x @ w if pretransposed else x @ w.T) + bias).relu()

    fn = plait.jit(net, device="cpu")
    weight = wt if pretransposed else w
    got = fn(x, weight, bias)
    want = torch.relu(torch.from_numpy(x) @ torch.from_numpy(w).T + torch.from_numpy(bias)).numpy()
    assert_close(got, want, "float32", f"linear rows={rows} pretransposed={pretransposed}", tol_scale=10)
    plan, _ = fn.plan_for([x, weight, bias])
    assert [k.name.split("_")[0] for k in plan.kernels] == ["GEMV"], [k.name for k in plan.kernels]
