"""The 3xTF32 GEMM's weight gradient gathering four k per load (knob VG=1): dy read in place from its NCHW buffer
as aligned float4 (`gemm_tc._vector_a`) and the transposed patch columns gathered from the image four output
positions at a time (`gemm_tc._vector_b`). The portable twin (MMA=0) runs the same tiling and loads on any OpenCL
device; kernels against NumPy, chunks crossing images, padding at both image edges, fringe tiles in M, N and K."""

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
from tests.ops.test_conv_gather_train_cl import _columns

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
VG = {"V": 3, "VG": 1}
TILES = [
    {"BM": 32, "BN": 32, "BK": 16, "WM": 16, "WN": 16},
    {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32},
]
CONV64 = {"BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2}  # the 64-filter convolutions' tiles
WIN = Window(3, 4, 6, 8, 3, 3, 1, 1, 1, 1, fold=True)  # 3 images, 4 channels, 6x8, 3x3 window, stride 1, padding 1
PLANE, CO, ROWS = 48, 20, 36  # output plane, dy's channels, patch rows (C * 3 * 3)


def _case(chunks: int, row0: int, m: int, in_place: bool) -> tuple[GemmSpec, np.ndarray, np.ndarray, np.ndarray]:
    """A weight-gradient spec over WIN's columns in `chunks` K chunks (dy's rows row0..row0+m), its A buffer (dy as
    NCHW with `in_place`, else as the (CO, N*P) rows), the image and the NumPy product."""
    span = WIN.n * PLANE
    x = rand((WIN.n, WIN.c, WIN.h, WIN.w), seed=4)
    dy_nchw = rand((WIN.n, CO, 6, 8), seed=5)
    dy = dy_nchw.transpose(1, 0, 2, 3).reshape(CO, span)
    cols = _columns(x, WIN)
    kc = span // chunks
    nchw = (PLANE, CO * PLANE) if in_place else None
    spec = GemmSpec(chunks, m, ROWS, kc, (row0 * span, kc, span, 1), (0, kc, 1, span), conv_t=WIN, a_nchw=nchw)
    want = np.stack(
        [dy[row0 : row0 + m, s * kc : (s + 1) * kc] @ cols[:, s * kc : (s + 1) * kc].T for s in range(chunks)]
    )
    return spec, (dy_nchw if in_place else np.ascontiguousarray(dy)), x, want


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("mma", [0, 1])
@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize(("chunks", "in_place"), [(1, False), (3, True), (9, True)])
def test_vector_gather_weight_gradient(
    device: str, mma: int, tile: dict[str, int], chunks: int, in_place: bool
) -> None:
    """dy @ columns^T whole or in 3 or 9 K chunks (48 and 16 long: the 16-long ones cross no image, the 48-long
    ones start at image boundaries; the K tiles of 32 run past them), rows 2..18 of dy; on tensor cores (MMA=1)
    where the device has them."""
    if mma and (why := gemm_tc.mma_tf32_unsupported(get_device(device))):
        pytest.skip(why)
    spec, a, x, want = _case(chunks, 2, 16, in_place)
    assert gemm_tc._vector_b(spec) and (not in_place or gemm_tc._vector_a(spec))
    kern = gemm.render_opencl(spec, {**VG, "MMA": mma, **tile}, get_device(device).renderer)
    assert "(float4)(in_" in kern.source and ("vload4(0, a + (long)((apos0_" in kern.source) == in_place
    got = run_gemm_kernel(device, kern, spec.batch, spec.m, spec.n, a, x)
    assert_close(got, want, "float32", f"VG=1 GEMM {tile}, {chunks} chunks", tol_scale=10)


def test_vector_gather_needs_whole_fours() -> None:
    """Strided windows, output rows or chunk starts not in whole fours keep the one-float gathers."""
    spec, _, _, _ = _case(3, 2, 16, True)
    strided = Window(3, 4, 6, 8, 3, 3, 1, 2, 1, 1, fold=True)
    assert not gemm_tc._vector_b(GemmSpec(1, 16, ROWS, 24, spec.a, spec.b, conv_t=strided))
    odd = Window(3, 4, 6, 6, 3, 3, 1, 1, 1, 1, fold=True)  # 6-wide output rows
    assert not gemm_tc._vector_b(GemmSpec(1, 16, ROWS, 24, spec.a, spec.b, conv_t=odd))
    shifted = GemmSpec(3, 16, ROWS, 46, (2 * 144 + 2, 46, 144, 1), (2, 46, 1, 144), conv_t=WIN, a_nchw=(48, 960))
    assert not gemm_tc._vector_b(shifted) and not gemm_tc._vector_a(shifted)
    kern = gemm.render_opencl(shifted, {**VG, "MMA": 0, **TILES[0]})
    assert "(float4)(in_" not in kern.source and "vload4(0, a + (long)((apos0_" not in kern.source


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("mma", [0, 1])
@pytest.mark.parametrize("fold", ["images", "graph", "knob"])
@pytest.mark.parametrize("tile", [TILES[0], CONV64])
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
        assert "(float4)(in_" not in gemm.render_opencl(other, {**VG, "MMA": 0, **TILES[0]}).source


def test_va_knob_reads_one_float_per_load() -> None:
    """VA=0 keeps the in-place output gradient's one-float loads where float4 ones would fit."""
    spec, _, _, _ = _case(3, 2, 16, True)
    assert gemm_tc._vector_a(spec)
    assert "vload4(0, a + (long)((apos0_" in gemm.render_opencl(spec, {"V": 3, "MMA": 0, **TILES[0]}).source
    assert (
        "vload4(0, a + (long)((apos0_" not in gemm.render_opencl(spec, {"V": 3, "MMA": 0, "VA": 0, **TILES[0]}).source
    )


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
