"""The tiles and K splits the OpenCL heuristics give alexnet b64's training products (docs/benchmarks.md, "alexnet's
training GEMMs"): KS 2 for implicit convolutions in 64x128 tiles without the four-column gather, 128x64 tiles with
KS 2 for weight gradients in short chunks and without it for a linear layer's weight gradient over a short K, and a
linear layer's input gradient split along K. Each runs tiny against PyTorch or a float64 product, on the portable
twin (MMA=0) everywhere and on tensor cores where the device has them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm, gemm_tc
from plait.codegen.gemm import GemmSpec
from plait.graph import autodiff
from plait.graph.ops.conv import Window
from plait.runtime import get_device
from plait.schedule.plan import Plan
from plait.tune import _tc_heuristic
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
CONV_KS2 = {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2}
ROWS_KS2 = {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32, "KS": 2}
OUTER = {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32}


def _paths(device: str) -> list[int]:
    """MMA knob values to test: the portable twin everywhere, the PTX path where the probe passed."""
    return [0] if gemm_tc.mma_tf32_unsupported(get_device(device)) else [0, 1]


@pytest.mark.parametrize("device", CL_DEVICES)
def test_convolution_ks2_without_four_columns(device: str) -> None:
    """A 5x5 stride-1 convolution with padding 2 over 7-wide rows (no four-column gather, as alexnet's 27-wide
    5x5 layer) in the 64x128 KS 2 tiles, against PyTorch."""
    win = Window(2, 5, 7, 7, 5, 5, 1, 1, 2, 2)
    co, k, plane = 9, 5 * 25, 49
    spec = GemmSpec(win.n, co, plane, k, (0, 0, k, 1), (0, win.c * 49, 0, 0), conv=win)
    assert not gemm_tc._vector_conv(spec)
    x, wt = rand((win.n, win.c, 7, 7), seed=1), rand((co, win.c, 5, 5), seed=2)
    want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(wt).double(), padding=2)
    for mma in _paths(device):
        kern = gemm.render_opencl(spec, {**CONV_KS2, "MMA": mma}, get_device(device).renderer)
        got = run_gemm_kernel(device, kern, spec.batch, co, plane, wt, x)
        assert_close(got.reshape(want.shape), want.numpy().astype(np.float32), "float32", f"KS 2 conv, MMA={mma}")


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("knobs", [ROWS_KS2, OUTER], ids=["chunks", "outer"])
def test_row_tiles_against_float64(device: str, knobs: dict[str, int]) -> None:
    """128x64 tiles over ragged rows and columns: a weight gradient's chunks (both operands contiguous along K,
    three chunks of K 48) with KS 2, and a linear layer's weight gradient dy^T @ x (A read transposed, K 24)."""
    m, n = 140, 70
    if knobs is ROWS_KS2:
        chunks, kc = 3, 48
        a, b = rand((m, chunks * kc), seed=3), rand((n, chunks * kc), seed=4)  # B stored (N, K)
        spec = GemmSpec(chunks, m, n, kc, (0, 0, chunks * kc, 1), (0, 0, 1, chunks * kc), chunks, kc, kc)
        want = np.stack([a[:, i * kc : (i + 1) * kc] @ b[:, i * kc : (i + 1) * kc].T for i in range(chunks)])
    else:
        k = 24
        a, b = rand((k, m), seed=5), rand((k, n), seed=6)  # A stored (K, M): dy with the batch as K
        spec = GemmSpec(1, m, n, k, (0, 0, 1, m), (0, 0, n, 1))
        want = (a.astype(np.float64).T @ b.astype(np.float64))[None]
    for mma in _paths(device):
        kern = gemm.render_opencl(spec, {**knobs, "MMA": mma}, get_device(device).renderer)
        got = run_gemm_kernel(device, kern, spec.batch, m, n, a, b)
        assert_close(got, want.astype(np.float32), "float32", f"{knobs}, MMA={mma}")


def test_heuristic_rules_for_alexnet_products() -> None:
    """alexnet b64's products get the swept tiles (KS 2 for the gathered convolutions, 128x64 tiles for the short
    chunks and the fc weight gradients); the products around them keep theirs."""
    win5 = Window(64, 192, 27, 27, 5, 5, 1, 1, 2, 2)
    dgrad = GemmSpec(64, 64, 729, 4800, (0, 0, 4800, 1), (0, 192 * 729, 0, 0), conv=win5)
    assert _tc_heuristic(dgrad) == CONV_KS2
    fwd = GemmSpec(1, 192, 46656, 1600, (0, 0, 1600, 1), (0, 0, 0, 0), conv=dataclasses.replace(win5, c=64, fold=True))
    assert _tc_heuristic(fwd) == CONV_KS2
    # the 13x13 layers' weight gradients in 13 chunks of 832; chunks of 1024+ keep 64x64 tiles
    wgrad = GemmSpec(13, 256, 3456, 832, (0, 0, 10816, 1), (0, 0, 1, 10816), 13, 832, 832)
    assert _tc_heuristic(wgrad) == ROWS_KS2
    assert _tc_heuristic(dataclasses.replace(wgrad, k=1664))["BM"] == 64
    assert _tc_heuristic(dataclasses.replace(wgrad, m=192))["BM"] == 64
    fc = GemmSpec(1, 4096, 9216, 64, (0, 0, 1, 4096), (0, 0, 9216, 1))
    assert _tc_heuristic(fc) == OUTER
    # a 1x1 convolution's forward over 64 channels (A the weight, rows along K) is no outer product
    assert _tc_heuristic(dataclasses.replace(fc, a=(0, 0, 64, 1))) != OUTER


@pytest.mark.parametrize("device", CL_DEVICES)
def test_linear_input_gradient_splits_k(device: str) -> None:
    """A linear layer's input gradient dy @ W at 16 rows over 1024 outputs runs as two K chunks of 512 summed by a
    reduction (`scheduler._input_grad_parts`), and matches PyTorch."""
    xa, wa, ga = rand((16, 40), seed=7), rand((1024, 40), seed=8), rand((16, 1024), seed=9)
    x = plait.tensor(xa, device=device, requires_grad=True)
    w = plait.tensor(wa, device=device)
    loss = (F.linear(x, w) * plait.tensor(ga, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    dx = autodiff.gradients(loss.node, seed, [x.node])[x.node.uid]
    items = Plan([dx]).items
    specs = [it.gemm for it in items if it.kind == "gemm" and it.gemm is not None]
    assert [(s.batch, s.m, s.n, s.k) for s in specs] == [(2, 16, 40, 512)], specs
    loss.backward()
    assert x.grad is not None
    # dx = dy @ W summed over 1024 outputs: against float64, within a plain FP32 product's error (PyTorch's)
    ref = ga.astype(np.float64) @ wa.astype(np.float64)
    fp32 = torch.from_numpy(ga) @ torch.from_numpy(wa)
    err, fp32_err = (float(np.abs(v - ref).max() / np.abs(ref).max()) for v in (x.grad.numpy(), fp32.numpy()))
    assert err <= 4 * fp32_err + 1e-7, f"split linear input gradient: max rel error {err:.2e} vs fp32 {fp32_err:.2e}"
