"""Two tile rules of the OpenCL heuristic for alexnet b64's training products (plait/tune `_large_gather_ks`,
`_ragged_batched_rows`): KS 2 on the 64x64 BK 32 tiles of weight gradients gathered from the image with a 5x5 or
larger kernel, and 64x64 BK 32 KS 2 tiles for a batch of wide products with their own A and rows that 128-row
tiles pad (Winograd's 192-filter products). The picks, and the kernels under those knobs against float64 on the
portable twin (MMA=0) everywhere and on tensor cores where the device has them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from plait.codegen import gemm, gemm_tc
from plait.codegen.gemm import GemmSpec
from plait.graph.ops.conv import Window
from plait.runtime import get_device
from plait.tune import _tc_heuristic
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
KS2_64 = {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "KS": 2}


def _paths(device: str) -> list[int]:
    """MMA knob values to test: the portable twin everywhere, the PTX path where the probe passed."""
    return [0] if gemm_tc.mma_tf32_unsupported(get_device(device)) else [0, 1]


def _columns(x: np.ndarray, win: Window) -> np.ndarray:
    """The folded patch columns (C*kh*kw, N*OH*OW) of `x` for a stride-1 window."""
    pad = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (win.ph, win.ph), (win.pw, win.pw)))
    cols = np.empty((win.c, win.kh, win.kw, win.n, win.oh, win.ow))
    for ky in range(win.kh):
        for kx in range(win.kw):
            cols[:, ky, kx] = pad[:, :, ky : ky + win.oh, kx : kx + win.ow].transpose(1, 0, 2, 3)
    return cols.reshape(win.c * win.kh * win.kw, -1)


def test_heuristic_picks() -> None:
    """alexnet b64's 5x5 and 11x11 gathered weight gradients and its 192-row Winograd product take KS 2 in 64x64
    tiles; a 3x3 gathered weight gradient, Winograd's 256-row products and few-column batches keep theirs."""
    win5 = Window(64, 64, 27, 27, 5, 5, 1, 1, 2, 2, fold=True)
    wgrad5 = GemmSpec(18, 192, 1600, 2592, (0, 0, 46656, 1), (0, 0, 1, 46656), 18, 2592, 2592, conv_t=win5)
    assert _tc_heuristic(wgrad5) == KS2_64
    stem = Window(64, 3, 224, 224, 11, 11, 4, 4, 2, 2, fold=True)
    wstem = GemmSpec(121, 64, 363, 1600, (0, 0, 193600, 1), (0, 0, 1, 193600), 121, 1600, 1600, conv_t=stem)
    assert _tc_heuristic(wstem) == KS2_64
    win3 = dataclasses.replace(win5, c=64, h=56, w=56, kh=3, kw=3, ph=1, pw=1)
    wgrad3 = GemmSpec(128, 64, 576, 1568, (0, 0, 200704, 1), (0, 0, 1, 200704), 128, 1568, 1568, conv_t=win3)
    assert "KS" not in _tc_heuristic(wgrad3)
    wino = GemmSpec(16, 192, 3136, 384, (0, 192 * 384, 384, 1), (0, 384 * 3136, 3136, 1))
    assert _tc_heuristic(wino) == KS2_64
    assert _tc_heuristic(dataclasses.replace(wino, m=256, a=(0, 256 * 384, 384, 1))) != KS2_64
    few = GemmSpec(64, 192, 32, 784, (0, 192 * 784, 784, 1), (0, 32 * 784, 1, 784))
    assert _tc_heuristic(few) != KS2_64


@pytest.mark.parametrize("device", CL_DEVICES)
def test_large_kernel_weight_gradient_ks2(device: str) -> None:
    """dy (Co, N*P) @ columns^T of a 5x5 padding-2 window in two K chunks, in the 64x64 BK 32 KS 2 tiles, against
    float64 (rows and columns ragged against the tiles)."""
    win = Window(2, 3, 9, 9, 5, 5, 1, 1, 2, 2, fold=True)
    span, chunks = win.n * win.oh * win.ow, 2
    kc, co, n = span // chunks, 70, win.c * 25
    x, dy = rand((win.n, win.c, win.h, win.w), seed=1), rand((co, span), seed=2)
    spec = GemmSpec(chunks, co, n, kc, (0, kc, span, 1), (0, kc, 1, span), conv_t=win)
    cols = _columns(x, win)
    want = np.stack([dy[:, s * kc : (s + 1) * kc] @ cols[:, s * kc : (s + 1) * kc].T for s in range(chunks)])
    for mma in _paths(device):
        kern = gemm.render_opencl(spec, {**KS2_64, "MMA": mma}, get_device(device).renderer)
        got = run_gemm_kernel(device, kern, chunks, co, n, dy, x)
        assert_close(got, want.astype(np.float32), "float32", f"5x5 conv_t KS 2, MMA={mma}", tol_scale=10)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_ragged_batched_rows_ks2(device: str) -> None:
    """Four products of 80 x 100 over K 96, each with its own A and B, in the 64x64 BK 32 KS 2 tiles."""
    batch, m, n, k = 4, 80, 100, 96
    a, b = rand((batch, m, k), seed=3), rand((batch, k, n), seed=4)
    spec = GemmSpec(batch, m, n, k, (0, m * k, k, 1), (0, k * n, n, 1))
    want = np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))
    for mma in _paths(device):
        kern = gemm.render_opencl(spec, {**KS2_64, "MMA": mma}, get_device(device).renderer)
        got = run_gemm_kernel(device, kern, batch, m, n, a, b)
        assert_close(got, want.astype(np.float32), "float32", f"ragged rows KS 2, MMA={mma}")
