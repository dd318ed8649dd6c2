"""The OpenCL GEMV kernels for products with few rows: both B layouts (columns contiguous along N, and along K as
a linear layer's transposed weight), float4 and scalar loads, batches, and a fused epilogue through a plan."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
from plait.codegen import gemm_small
from plait.codegen.gemm import GemmSpec
from plait.errors import UnsupportedError
from plait.runtime import get_device
from tests.conftest import DEVICES
from tests.helpers import assert_close, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]


def _run(device: str, spec: GemmSpec, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, str]:
    kern = gemm_small.render(spec, get_device(device).renderer)
    return run_gemm_kernel(device, kern, spec.batch, spec.m, spec.n, a, b), kern.name


# (batch, m, n, k, b transposed): k-contiguous B with float4 loads (k % 4 == 0) and without, column layouts
CASES = [(1, 1, 37, 64, True), (2, 3, 20, 37, True), (1, 15, 9, 1, True), (3, 1, 70, 9, False), (1, 5, 33, 40, False)]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize(("batch", "m", "n", "k", "tb"), CASES)
def test_gemv_matches_float64(device, batch, m, n, k, tb):
    rng = np.random.default_rng(m * 100 + n + k)
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    bm = np.ascontiguousarray(b.transpose(0, 2, 1)) if tb else b
    sb = (0, k * n, 1, k) if tb else (0, k * n, n, 1)
    got, name = _run(device, GemmSpec(batch, m, n, k, (0, m * k, k, 1), sb), a, bm)
    assert name.startswith("GEMV_"), name
    assert_close(got, np.matmul(a.astype(np.float64), b.astype(np.float64)), "float32", f"{name}", tol_scale=10)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_linear_and_depthwise_layers_use_gemv(device):
    """A batch-1 linear layer with bias + relu (fused) and a depthwise convolution run as GEMV kernels."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 4, 9, 7), dtype=np.float32)
    dw = rng.standard_normal((4, 1, 3, 3), dtype=np.float32)
    lw = rng.standard_normal((10, 4 * 9 * 7), dtype=np.float32) * 0.1
    lb = rng.standard_normal(10, dtype=np.float32)

    def net(x: plait.Tensor, dw: plait.Tensor, lw: plait.Tensor, lb: plait.Tensor) -> plait.Tensor:
        y = plait.nn.functional.conv2d(x, dw, padding=1, groups=4)
        return (y.reshape(1, -1) @ lw.T + lb).relu()

    fn = plait.jit(net, device=device)
    got = fn(x, dw, lw, lb)
    tx, tdw, tlw, tlb = (torch.from_numpy(v) for v in (x, dw, lw, lb))
    want = torch.relu(torch.nn.functional.conv2d(tx, tdw, padding=1, groups=4).reshape(1, -1) @ tlw.T + tlb)
    assert_close(got, want.numpy(), "float32", f"depthwise + linear on {device}", tol_scale=10)
    plan, _ = fn.plan_for([x, dw, lw, lb])
    assert sum(k.name.startswith("GEMV_") for k in plan.kernels) == 2, [k.name for k in plan.kernels]


def test_too_many_rows_are_refused():
    with pytest.raises(UnsupportedError, match="at most 15 rows"):
        gemm_small.render(GemmSpec(1, 16, 8, 8, (0, 0, 8, 1), (0, 0, 8, 1)))
