"""Implicit-GEMM convolution on OpenCL: every OpenCL GEMM kernel (3xTF32 and its portable twin, batch folded into
the columns or not, the FP32 templates, the GEMV) reads its B tile straight from the image through the window
(stride, padding, dilation, groups) instead of an im2col buffer; kernels and whole plans against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
import plait.tune
from plait.codegen import gemm
from plait.codegen.gemm import GemmSpec
from plait.codegen.gemm_tc import mma_tf32_unsupported
from plait.graph.ops.conv import Window
from plait.runtime import get_device
from plait.schedule.scheduler import schedule
from tests.conftest import DEVICES
from tests.helpers import assert_close, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
SMALL = {"V": 3, "BM": 32, "BN": 32, "BK": 8, "WM": 16, "WN": 16}
WIDE = {"V": 3, "BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32}  # the plans' tiles
SPLIT_K = {**SMALL, "BK": 32, "WK": 2}
BIG = {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64}
FP32 = [{}, {"TSM": 32, "TSN": 32, "TSK": 16, "WPTM": 2, "WPTN": 2}, {"V": 2, "TSK": 8}]

GEOMETRIES = [  # n, c, h, w, co, kh, kw, stride, padding, dilation, groups
    (2, 5, 11, 9, 20, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (1, 3, 17, 15, 18, 7, 7, (2, 2), (3, 3), (1, 1), 1),
    (3, 6, 8, 10, 18, 3, 2, (2, 1), (0, 1), (2, 1), 3),
    (2, 8, 7, 7, 40, 1, 1, (2, 2), (0, 0), (1, 1), 1),
    (2, 6, 9, 11, 6, 3, 3, (1, 1), (1, 1), (1, 1), 6),  # depthwise
    (2, 4, 15, 12, 4, 5, 5, (2, 2), (2, 2), (1, 1), 4),  # depthwise, strided
]


def _conv_spec(n, c, h, w, co, kh, kw, stride, padding, dilation, groups) -> GemmSpec:
    """The implicit-convolution GEMM the scheduler makes: per (image, group), the group's filters times the
    group's patch columns, gathered from the NCHW image."""
    win = Window(n, c // groups, h, w, kh, kw, *stride, *padding, *dilation)
    cg, cog, k = c // groups, co // groups, c // groups * kh * kw
    a = (0, 0, k, 1)
    b = (0, c * h * w, 0, 0)
    inner_a, inner_b = (cog * k, cg * h * w) if groups > 1 else (0, 0)
    return GemmSpec(n * groups, cog, win.oh * win.ow, k, a, b, groups, inner_a, inner_b, win)


def _run(device: str, spec: GemmSpec, knobs: dict[str, int], w: np.ndarray, x: np.ndarray) -> np.ndarray:
    kern = gemm.render_opencl(spec, knobs, get_device(device).renderer)
    return run_gemm_kernel(device, kern, spec.batch, spec.m, spec.n, w, x)


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_kernels_gather_patches(device, geo):
    n, c, h, w, co, kh, kw, stride, padding, dilation, groups = geo
    rng = np.random.default_rng(co * h + kw)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((co, c // groups, kh, kw), dtype=np.float32)
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(wt), None, stride, padding, dilation, groups
    )
    want64 = torch.nn.functional.conv2d(
        torch.from_numpy(x).double(), torch.from_numpy(wt).double(), None, stride, padding, dilation, groups
    ).numpy()
    spec = _conv_spec(*geo)
    fp32_err = float(np.abs(want.numpy() - want64).max() / np.abs(want64).max())
    configs: list[dict[str, int]] = [{"V": 4}] if spec.m <= 15 else []
    if spec.m >= 16:
        for mma in [0] if mma_tf32_unsupported(get_device(device)) else [0, 1]:
            configs += [{**SMALL, "MMA": mma}, {**SPLIT_K, "MMA": mma, "FOLD": int(groups == 1)}]
            # the gather without the k-table (GT=0), folded and not
            configs += [{**SMALL, "MMA": mma, "GT": 0}, {**SPLIT_K, "MMA": mma, "FOLD": int(groups == 1), "GT": 0}]
        configs += FP32 if geo == GEOMETRIES[0] else FP32[:1]
        if geo == GEOMETRIES[0]:  # the heuristic's tiles for large products (four 64x64 warp tiles), folded or not
            configs += [{**BIG, "MMA": 0}, {**BIG, "MMA": 0, "FOLD": 1}]
    for knobs in configs:
        got = _run(device, spec, knobs, wt, x).reshape(want.shape)
        err = float(np.abs(got - want64).max() / np.abs(want64).max())
        assert err <= 4 * fp32_err + 1e-6, f"{knobs} {geo}: max rel error {err:.2e} vs fp32 {fp32_err:.2e}"


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_plans_read_the_image(device, geo, monkeypatch):
    """Inference plans on OpenCL make no im2col buffer: the GEMM (tensor-core twin or GEMV) gathers the patches and
    runs bias + ReLU in its epilogue, one kernel per convolution."""
    mma = 0 if mma_tf32_unsupported(get_device(device)) else 1

    def knobs(device: object, kind: str, spec: GemmSpec) -> dict[str, int]:
        return {"V": 4} if spec.m <= 15 else {**WIDE, "MMA": mma}

    monkeypatch.setattr(plait.tune, "_heuristic", knobs)
    n, c, h, w, co, kh, kw, stride, padding, dilation, groups = geo
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((co, c // groups, kh, kw), dtype=np.float32)
    bias = rng.standard_normal(co, dtype=np.float32)

    def net(t: plait.Tensor) -> plait.Tensor:
        wp, bp = plait.tensor(wt, device=device), plait.tensor(bias, device=device)
        return F.conv2d(t, wp, bp, stride, padding, dilation, groups).relu()

    fn = plait.jit(net, device=device)
    got = fn(x)
    want = torch.nn.functional.conv2d(*(torch.from_numpy(v) for v in (x, wt, bias)), stride, padding, dilation, groups)
    assert_close(got, want.relu().numpy(), "float32", f"conv2d {geo} on {device}", tol_scale=10)
    plan, _ = fn.plan_for([x])
    kinds = [k.name.split("_")[0] for k in plan.kernels]
    if (kh, kw) != (1, 1) or stride != (1, 1):
        assert kinds == ["GEMV" if co // groups <= 15 else "GEMM3XTF32" if mma else "GEMM3XTF32EMU"], kinds


@pytest.mark.parametrize("device", CL_DEVICES)
def test_split_k_few_tile_products(device, monkeypatch):
    """Batch-1 products with few output tiles and a long K (late convolution layers, a narrow linear product) run
    as a batch of K-chunk products whose sum is reduced over the chunks; chunks hold whole 3x3 windows, so the
    convolution's chunks still gather from the image."""
    mma = 0 if mma_tf32_unsupported(get_device(device)) else 1

    def knobs(device: object, kind: str, spec: GemmSpec) -> dict[str, int]:
        return {"V": 4} if spec.m <= 15 else {**SMALL, "MMA": mma}

    monkeypatch.setattr(plait.tune, "_heuristic", knobs)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 64, 7, 7), dtype=np.float32)
    wt = rng.standard_normal((40, 64, 3, 3), dtype=np.float32) * 0.1
    bias = rng.standard_normal(40, dtype=np.float32)
    a = rng.standard_normal((48, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 40), dtype=np.float32)

    def net(t: plait.Tensor, a: plait.Tensor, b: plait.Tensor) -> tuple[plait.Tensor, plait.Tensor]:
        wp, bp = plait.tensor(wt, device=device), plait.tensor(bias, device=device)
        return F.conv2d(t, wp, bp, padding=1).relu(), a @ b

    fn = plait.jit(net, device=device)
    conv, mm = fn(x, a, b)
    want = torch.nn.functional.conv2d(*(torch.from_numpy(v) for v in (x, wt, bias)), padding=1).relu()
    assert_close(conv, want.numpy(), "float32", f"split-K conv on {device}", tol_scale=10)
    assert_close(mm, a @ b, "float32", f"split-K matmul on {device}", tol_scale=10)
    plan, _ = fn.plan_for([x, a, b])
    names = [k.name for k in plan.kernels]
    kind = "GEMM3XTF32_" if mma else "GEMM3XTF32EMU_"
    # K 576 = two chunks of 32 channels x 9 taps; K 1024 of 48 rows times a stored (K, N) matrix takes the rule of
    # a linear layer's input gradient (scheduler `_input_grad_parts`): chunks of at least 512, so two
    assert any(name.startswith(f"{kind}2x40x49x288_") for name in names), names
    assert any(name.startswith(f"{kind}2x48x40x512_") for name in names), names
    assert not any(name.startswith("IM2COL") or "im2col" in name for name in names), names


def test_split_k_picks_whole_window_chunks():
    """The split-K decision on shapes alone: resnet18's last 3x3 layers at batch 1 (512 x 49, K 4608) split into 16
    chunks of 32 channels x 9 taps still gathered from the image; batches and short K stay whole; a transposed
    linear weight is chunked in its stored layout, into more chunks (it streams the weight once)."""

    def gemms(out: plait.Tensor) -> list[GemmSpec]:
        items = schedule([out.node], 256, implicit_conv=True, split_k=True)
        return [it.gemm for it in items if it.gemm is not None]

    rng = np.random.default_rng(0)

    def t(*shape: int) -> plait.Tensor:
        return plait.tensor(rng.standard_normal(shape, dtype=np.float32))

    (late,) = gemms(F.conv2d(t(1, 512, 7, 7), t(512, 512, 3, 3), padding=1))
    assert (late.batch, late.m, late.n, late.k, late.conv is not None) == (16, 512, 49, 288, True)
    (batched,) = gemms(F.conv2d(t(8, 512, 7, 7), t(512, 512, 3, 3), padding=1))
    assert (batched.batch, batched.k) == (8, 4608)
    (short,) = gemms(F.conv2d(t(1, 32, 7, 7), t(64, 32, 3, 3), padding=1))
    assert (short.batch, short.k) == (1, 288)
    (linear,) = gemms(t(64, 4096) @ t(1000, 4096).T)
    assert (linear.batch, linear.k) == (16, 256)  # streaming the weight: scheduler.STREAM_SPLIT_TARGET


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("geo", [GEOMETRIES[0], GEOMETRIES[2], GEOMETRIES[3]])
def test_kernels_gather_columns_of_every_image(device, geo):
    """Patch columns with the batch folded in (C*kh*kw, N, OH*OW): one product per group whose columns run over
    every image's output positions; each kernel finds a column's image itself (tensor-core twin with and without
    the k-table, an FP32 template, the GEMV)."""
    n, c, h, w, co, kh, kw, stride, padding, dilation, groups = geo
    rng = np.random.default_rng(co * w + kh)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((co, c // groups, kh, kw), dtype=np.float32)
    want64 = torch.nn.functional.conv2d(
        torch.from_numpy(x).double(), torch.from_numpy(wt).double(), None, stride, padding, dilation, groups
    ).numpy()
    win = Window(n, c, h, w, kh, kw, *stride, *padding, *dilation)
    cg, cog, k, p = c // groups, co // groups, c // groups * kh * kw, win.oh * win.ow
    spec = GemmSpec(groups, cog, n * p, k, (0, cog * k, k, 1), (0, cg * h * w, 0, 0), conv=win)
    configs = [{**SMALL, "MMA": 0}, {**SMALL, "MMA": 0, "GT": 0}, {**SPLIT_K, "MMA": 0}, {}]
    if cog <= 15:
        configs.append({"V": 4})
    for knobs in configs:
        got = _run(device, spec, knobs, wt, x).reshape(co, n, p).transpose(1, 0, 2).reshape(want64.shape)
        err = float(np.abs(got - want64).max() / np.abs(want64).max())
        assert err <= 1e-5, f"{knobs} {geo}: max rel error {err:.2e}"
