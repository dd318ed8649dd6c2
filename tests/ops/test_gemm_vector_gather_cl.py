"""The 3xTF32 GEMM's implicit convolution gathering four neighbouring columns per load (knob VG=1,
`gemm_tc._vector_conv`), which the tile heuristic gives 64-filter 3x3 convolutions over 64+ channels
(`tune._four_columns`). The portable twin (MMA=0) runs the same tiling and loads on any OpenCL device, the
tensor-core kernel where the device has them; against PyTorch, with padding at both image edges and fringe tiles."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from plait.codegen import gemm, gemm_tc
from plait.codegen.gemm import GemmSpec
from plait.graph.ops.conv import Window
from plait.runtime import get_device
from plait.tune import _tc_heuristic
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
VG = {"V": 3, "VG": 1}
SMALL = {"BM": 32, "BN": 32, "BK": 16, "WM": 16, "WN": 16}  # edges in every tile
CONV64 = {"BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2}  # the 64-filter convolutions' tiles
WIN = Window(3, 4, 6, 8, 3, 3, 1, 1, 1, 1, fold=True)  # 3 images, 4 channels, 6x8, 3x3 window, stride 1, padding 1
PLANE, CO = 48, 20  # output plane, filters


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("mma", [0, 1])
@pytest.mark.parametrize("fold", ["images", "graph", "knob"])
@pytest.mark.parametrize("tile", [SMALL, CONV64])
def test_vector_gather_convolution(device: str, mma: int, fold: str, tile: dict[str, int]) -> None:
    """An implicit 3x3 stride-1 convolution (20 filters over WIN) gathering four neighbouring output columns per
    load against PyTorch: one product per image ("images"), the images folded into the columns by the graph
    ("graph": 144 columns, each four within one image's output row) or by the knob FOLD=1 ("knob"); small tiles,
    and the 64-filter products' tiles (`tune._four_columns`)."""
    if mma and (why := gemm_tc.mma_tf32_unsupported(get_device(device))):
        pytest.skip(why)
    x = rand((WIN.n, WIN.c, WIN.h, WIN.w), seed=6)
    wt = rand((CO, WIN.c, 3, 3), seed=7)
    want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(wt).double(), padding=1).numpy()
    k, chw = WIN.c * 9, WIN.c * WIN.h * WIN.w
    if fold == "graph":
        spec = GemmSpec(1, CO, WIN.n * PLANE, k, (0, 0, k, 1), (0, chw, 0, 0), conv=WIN)
    else:
        spec = GemmSpec(WIN.n, CO, PLANE, k, (0, 0, k, 1), (0, chw, 0, 0), conv=dataclasses.replace(WIN, fold=False))
    assert gemm_tc._vector_conv(spec)
    knobs = {**VG, "MMA": mma, **tile, "FOLD": int(fold == "knob")}
    kern = gemm.render_opencl(spec, knobs, get_device(device).renderer)
    assert "(float4)(in_" in kern.source
    got = run_gemm_kernel(device, kern, spec.batch, spec.m, spec.n, wt, x)
    if fold == "graph":
        got = got.reshape(CO, WIN.n, PLANE).transpose(1, 0, 2)
    assert_close(got.reshape(want.shape), want.astype(np.float32), "float32", f"VG=1 convolution, {fold}")


def test_vector_conv_needs_whole_fours() -> None:
    """A strided window or output rows not in whole fours keep one gathered column per load."""
    spec = GemmSpec(1, CO, WIN.n * PLANE, 36, (0, 0, 36, 1), (0, 192, 0, 0), conv=WIN)
    assert gemm_tc._vector_conv(spec)
    for win in (dataclasses.replace(WIN, sw=2), dataclasses.replace(WIN, w=6)):
        other = dataclasses.replace(spec, n=win.n * win.oh * win.ow, conv=win)
        assert not gemm_tc._vector_conv(other)
        assert "(float4)(in_" not in gemm.render_opencl(other, {**VG, "MMA": 0, **SMALL}).source


def test_four_columns_for_64_filter_convolutions() -> None:
    """The heuristic gives vgg16 b64's 64-filter 3x3 forward (64x128 tiles) four-column gathers and KS 2; not a
    3-channel stem (K 27), a stride-2 window or 27-wide output rows (alexnet)."""
    win = Window(64, 64, 224, 224, 3, 3, 1, 1, 1, 1, fold=True)
    spec = GemmSpec(1, 64, 64 * 50176, 576, (0, 0, 576, 1), (0, 64 * 50176, 0, 0), conv=win)
    assert _tc_heuristic(spec) == {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2, "VG": 1}
    stem = dataclasses.replace(spec, k=27, conv=dataclasses.replace(win, c=3))
    strided = dataclasses.replace(spec, n=64 * 112 * 112, conv=dataclasses.replace(win, sh=2, sw=2))
    narrow = dataclasses.replace(spec, n=64 * 729, conv=dataclasses.replace(win, h=27, w=27))
    for other in (stem, strided, narrow):
        assert "VG" not in _tc_heuristic(other)
