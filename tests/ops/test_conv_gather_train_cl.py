"""Training convolutions on OpenCL without patch columns: a weight gradient (dy @ columns^T, whole or in K chunks)
gathers the transposed folded columns from the image (`GemmSpec.conv_t`), the forward product gathers them too,
so the im2col is never made; a 3x3 stride-1 forward with the batch folded in can run as Winograd, writing the
(K, N, OH*OW) layout. Kernels against NumPy, schedules, and whole gradients against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen import gemm, gemm_tc
from plait.codegen.gemm import GemmSpec
from plait.graph import autodiff
from plait.graph.ops.conv import Window
from plait.runtime import get_device
from plait.schedule.scheduler import _grad_parts, _wide_grad_parts, schedule
from plait.tune import _tc_heuristic
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
KNOBS = [
    {"V": 3, "MMA": 0, "BM": 32, "BN": 32, "BK": 16, "WM": 16, "WN": 16},  # the 3xTF32 twin, edges in every tile
    {"V": 3, "MMA": 0, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32},  # the weight gradients' tiles
    {"V": 3, "MMA": 0, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64},  # the wide ones'
    {},  # the FP32 template
    {"V": 2, "TSK": 8},
]
WIN = Window(64, 256, 56, 56, 3, 3, 1, 1, 1, 1, fold=True)  # vgg16's 256-channel layers at batch 64
OPENCL_FLAGS = {"implicit_conv": True, "split_k": True, "conv_span": True, "winograd_cl": True}


def _columns(x: np.ndarray, win: Window) -> np.ndarray:
    """The folded patch columns (C*kh*kw, N*OH*OW) of `x`, as im2col lays them out."""
    pad = np.pad(x, ((0, 0), (0, 0), (win.ph, win.ph), (win.pw, win.pw)))
    cols = np.empty((win.c, win.kh, win.kw, win.n, win.oh, win.ow), np.float32)
    for ky in range(win.kh):
        for kx in range(win.kw):
            y0, x0 = ky * win.dh, kx * win.dw
            view = pad[:, :, y0 : y0 + (win.oh - 1) * win.sh + 1 : win.sh, x0 : x0 + (win.ow - 1) * win.sw + 1 : win.sw]
            cols[:, ky, kx] = view.transpose(1, 0, 2, 3)
    return cols.reshape(win.c * win.kh * win.kw, -1)


def _run(device: str, spec: GemmSpec, knobs: dict[str, int], a: np.ndarray, image: np.ndarray) -> np.ndarray:
    kern = gemm.render_opencl(spec, knobs, get_device(device).renderer)
    return run_gemm_kernel(device, kern, spec.batch, spec.m, spec.n, a, image)


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("knobs", KNOBS)
@pytest.mark.parametrize("chunks", [1, 3])
def test_weight_gradient_kernels_gather_columns(device: str, knobs: dict[str, int], chunks: int) -> None:
    """dy (Co, N*P) @ columns^T of a 3x3, stride-2, padding-1, dilation-(2, 1) window, whole or as 3 K chunks
    (a batch of partial products, as split-K makes), against NumPy; columns 8..8+N of the patch rows only when
    whole, so the row offset is exercised."""
    win = Window(3, 4, 11, 9, 3, 3, 2, 2, 1, 1, 2, 1, fold=True)
    span, rows = win.n * win.oh * win.ow, win.c * win.kh * win.kw
    x = rand((win.n, win.c, win.h, win.w), seed=4)
    dy = rand((20, span), seed=5)
    cols = _columns(x, win)
    if chunks == 1:
        n, row0, kc = rows - 8, 8, span
        spec = GemmSpec(1, 20, n, kc, (0, 0, span, 1), (row0 * span, 0, 1, span), conv_t=win)
    else:
        n, row0, kc = rows, 0, span // chunks
        spec = GemmSpec(chunks, 20, n, kc, (0, kc, span, 1), (0, kc, 1, span), conv_t=win)
    got = _run(device, spec, knobs, dy, x)
    want = np.stack(
        [dy[:, s * kc : (s + 1) * kc] @ cols[row0 : row0 + n, s * kc : (s + 1) * kc].T for s in range(chunks)]
    )
    assert_close(got, want, "float32", f"conv_t GEMM {knobs}, {chunks} chunks", tol_scale=10)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_weight_gradient_gathers_without_row_table(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the row table cannot hold a window's shifts, the 3xTF32 kernel divides per element instead."""
    monkeypatch.setattr(gemm_tc, "_rows_fit", lambda spec: False)
    win = Window(2, 3, 10, 10, 5, 5, 1, 1, 2, 2, fold=True)
    span = win.n * win.oh * win.ow
    x, dy = rand((2, 3, 10, 10), seed=6), rand((16, span), seed=7)
    spec = GemmSpec(1, 16, 75, span, (0, 0, span, 1), (0, 0, 1, span), conv_t=win)
    got = _run(device, spec, KNOBS[0], dy, x)
    assert_close(got[0], dy @ _columns(x, win).T, "float32", "conv_t GEMM, no row table", tol_scale=10)


def _step(
    device: str, n: int, c: int, hw: int, co: int, k: int, stride: int, pad: int, groups: int = 1, dilation: int = 1
):
    """A convolution with a recorded gradient, its loss against fixed weights, and the gradients' nodes."""
    x = plait.tensor(rand((n, c, hw, hw), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((co, c // groups, k, k), seed=2), device=device, requires_grad=True)
    y = F.conv2d(x, w, stride=stride, padding=pad, groups=groups, dilation=dilation)
    g = rand(y.shape, seed=3)
    loss = (y * plait.tensor(g, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    return x, w, y, g, autodiff.gradients(loss.node, seed, [w.node, x.node])


def test_training_convolution_makes_no_patch_columns() -> None:
    """On OpenCL's flags a strided training convolution's forward and split weight gradient both gather from the
    image: no im2col kernel is left, and the weight gradient's chunks are `conv_t` products."""
    x, w, y, _, grads = _step("cpu", 8, 8, 32, 64, 3, 2, 1)
    items = schedule([grads[w.node.uid], grads[x.node.uid], y.node], 256, **OPENCL_FLAGS)
    assert not [it for it in items if it.out.op == "im2col"]
    specs = [it.gemm for it in items if it.kind == "gemm" and it.gemm is not None]
    (wgrad,) = [s for s in specs if s.conv_t is not None]
    assert (wgrad.m, wgrad.n, wgrad.batch * wgrad.k) == (64, 72, 8 * 16 * 16) and wgrad.batch > 1
    assert any(s.conv is not None and s.conv.fold for s in specs)  # the forward


def test_patch_columns_stay_where_a_reader_cannot_gather() -> None:
    """Without OpenCL's folded gather (the cpu's flags) the columns stay one buffer that both products read."""
    _, w, y, _, grads = _step("cpu", 2, 4, 12, 32, 3, 2, 1)
    items = schedule([grads[w.node.uid], y.node], 16, implicit_conv=True)
    assert [it for it in items if it.out.op == "im2col"]
    assert not [it for it in items if it.gemm is not None and it.gemm.conv_t is not None]


def test_weight_gradient_chunks() -> None:
    """K chunks of a weight gradient: resnet18 b64's 64 x 576 product over K = 64 x 3136 in 128 chunks of 1568;
    alexnet b64's 13x13 layers (K = 64 x 169, 216 tiles) in 13 chunks of 832 where chunks of 1024 or more allow
    only two."""
    assert _grad_parts(64 * 3136, 32, 9) == 128
    assert _grad_parts(64 * 169, 32, 216) == 13
    assert _grad_parts(4096, 32, 1) == 4  # no split reaches the target: the most chunks of 1024


def test_wide_weight_gradients_split_for_128x128_tiles() -> None:
    """vgg16 b64's 256 x 2304 and 512 x 4608 weight gradients split into chunks of 6272 for 128x128 tiles (64x64 per
    warp); where such chunks would be shorter than 4096 (its 512 x 2304 over K 50176) the 64x64 rule stays."""
    assert _wide_grad_parts(256, 2304, 64 * 3136, 32) == 32
    assert _wide_grad_parts(512, 4608, 64 * 784, 32) == 8
    assert _wide_grad_parts(512, 2304, 64 * 784, 32) == 0 and _wide_grad_parts(128, 4608, 64 * 3136, 32) == 0
    wide = GemmSpec(32, 256, 2304, 6272, (0, 0, 200704, 1), (0, 0, 1, 200704), 32, 6272, 6272, conv_t=WIN)
    assert _tc_heuristic(wide) == {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64}
    fewer = GemmSpec(8, 256, 2304, 25088, (0, 0, 200704, 1), (0, 0, 1, 200704), 8, 25088, 25088, conv_t=WIN)
    assert _tc_heuristic(fewer)["BM"] == 64  # too few 128x128 tiles: the 64x64 rule


@pytest.mark.parametrize("device", CL_DEVICES)
def test_folded_forward_runs_winograd(device: str) -> None:
    """A 3x3 stride-1 training convolution with 128 channels in and out over 1024 tiles: its folded forward is a
    Winograd plan writing the (K, N, OH*OW) layout, and its columns are never made."""
    _, w, y, _, grads = _step(device, 16, 128, 16, 128, 3, 1, 1)
    items = schedule([grads[w.node.uid], y.node], 256, **OPENCL_FLAGS)
    (plan,) = [it.extra["winograd"] for it in items if it.kind == "winograd"]
    assert plan.fold and (plan.n, plan.c, plan.k) == (16, 128, 128)
    assert not [it for it in items if it.out.op == "im2col"]


GEOMETRIES = [  # n, c, hw, co, k, stride, padding, groups, dilation
    (3, 5, 11, 20, 3, 2, 1, 1, 1),
    (2, 3, 9, 20, 3, 1, 1, 1, 1),  # 3x3 stride 1: Winograd with '2' below
    (2, 3, 19, 16, 11, 4, 2, 1, 1),  # alexnet's first layer, small
    (2, 8, 9, 32, 3, 2, 1, 2, 1),  # two groups: each group's rows of the columns
    (2, 4, 12, 20, 3, 1, 2, 1, 2),  # dilated
    (2, 8, 9, 24, 1, 2, 0, 1, 1),  # a strided 1x1 (resnet's downsampling)
]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_training_gradients_match_torch(device: str, geo: tuple[int, ...]) -> None:
    n, c, hw, co, k, stride, pad, groups, dilation = geo
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        x, w, y, g, grads = _step(device, n, c, hw, co, k, stride, pad, groups, dilation)
        got = [y.numpy(), plait.Tensor(grads[w.node.uid]).numpy(), plait.Tensor(grads[x.node.uid]).numpy()]
    xt = torch.tensor(x.numpy(), dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w.numpy(), dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad, groups=groups, dilation=dilation)
    (yt * torch.tensor(g, dtype=torch.float64)).sum().backward()
    for what, have, want in zip(("output", "weight gradient", "input gradient"), got, (yt, wt.grad, xt.grad)):
        assert_close(have, want.detach().numpy().astype(np.float32), "float32", f"conv2d {geo} {what}", tol_scale=20)
