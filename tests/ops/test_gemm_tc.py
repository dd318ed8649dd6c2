"""The 3xTF32 tensor-core GEMM template: FP32-level accuracy against a float64 product, every operand layout,
ragged edges, two-level batches, fused epilogues in whole plans, and the mma.sync capability probe.

On OpenCL devices without tensor cores (PoCL here) the portable twin (MMA=0) runs the same tiling, pipelining,
bounds and epilogue code with emulated TF32 rounding; where the probe passes (NVIDIA) the PTX path runs too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.tune
from plait.codegen import gemm
from plait.codegen.gemm import GemmSpec
from plait.codegen.gemm_tc import TC_DEFAULT, check_device, check_knobs, local_bytes, mma_tf32_unsupported, run_probe
from plait.errors import DeviceError, UnsupportedError
from plait.runtime import get_device
from plait.runtime.base import join_sources
from tests.conftest import DEVICES
from tests.helpers import assert_close, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
SMALL = {"V": 3, "BM": 32, "BN": 32, "BK": 8, "WM": 16, "WN": 16}  # 4 warps, one 16x16 sub-tile each
WIDE = {"V": 3, "BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32}
WIDE_KS2 = {**WIDE, "KS": 2}  # two k8 steps chained in the tensor core per FP32 add
SPLIT_K = {**SMALL, "BK": 32, "WK": 2}  # two warp groups split each K tile, sums meet in local memory


def _paths(device: str) -> list[int]:
    """MMA knob values to test: the portable twin everywhere, the PTX path where the probe passed."""
    return [0] if mma_tf32_unsupported(get_device(device)) else [0, 1]


def _run(device: str, spec: GemmSpec, knobs: dict[str, int], a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, str]:
    kern = gemm.render_opencl(spec, knobs, get_device(device).renderer)
    return run_gemm_kernel(device, kern, spec.batch, spec.m, spec.n, a, b), kern.name


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


# (batch, m, n, k, a transposed, b transposed): ragged edges (vec 1) and 4-aligned sizes (float4 loads)
CASES = [
    (1, 70, 45, 37, False, False),
    (1, 70, 45, 37, True, True),
    (2, 64, 96, 128, False, False),
    (2, 64, 96, 128, True, True),
    (1, 33, 8, 200, False, True),
]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize(("batch", "m", "n", "k", "ta", "tb"), CASES)
def test_3xtf32_accuracy_matches_fp32(device, batch, m, n, k, ta, tb):
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    # operands in memory as given; the spec's strides say how to read A[b, m, k] and B[b, k, n]
    am = np.ascontiguousarray(a.transpose(0, 2, 1)) if ta else a
    bm = np.ascontiguousarray(b.transpose(0, 2, 1)) if tb else b
    sa = (0, m * k, 1, m) if ta else (0, m * k, k, 1)
    sb = (0, k * n, 1, k) if tb else (0, k * n, n, 1)
    spec = GemmSpec(batch, m, n, k, sa, sb)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    fp32_err = _rel_err(np.matmul(a, b), ref)
    for mma in _paths(device):
        for knobs in (SMALL, WIDE, WIDE_KS2, SPLIT_K):
            got, name = _run(device, spec, {**knobs, "MMA": mma}, am, bm)
            assert name.startswith("GEMM3XTF32_" if mma else "GEMM3XTF32EMU_"), name
            err = _rel_err(got, ref)
            # a single TF32 product would be ~1e-3 off; 3xTF32 stays at a plain FP32 GEMM's error
            assert err <= 4 * fp32_err + 1e-7, f"{name} {knobs}: max rel error {err:.2e} vs fp32 {fp32_err:.2e}"


@pytest.mark.parametrize("device", CL_DEVICES)
def test_two_level_batch_strides(device):
    """Grouped products: batch index = (image, group), A shared across images, B strided per group."""
    rng = np.random.default_rng(3)
    imgs, groups, m, n, k = 2, 3, 16, 24, 40
    a = rng.standard_normal((groups, m, k), dtype=np.float32)
    b = rng.standard_normal((imgs, groups, k, n), dtype=np.float32)
    spec = GemmSpec(imgs * groups, m, n, k, (0, 0, k, 1), (0, groups * k * n, n, 1), groups, m * k, k * n)
    ref = np.matmul(a[None].astype(np.float64), b.astype(np.float64)).reshape(imgs * groups, m, n)
    for mma in _paths(device):
        got, _ = _run(device, spec, {**SMALL, "MMA": mma}, a, b)
        assert _rel_err(got, ref) < 1e-6


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize(("n", "tb"), [(7, False), (12, False), (9, True)])
def test_batch_folded_into_columns(device, n, tb):
    """FOLD=1: a shared A times many narrow B (a late convolution layer at batch 64) as one wide product."""
    rng = np.random.default_rng(n)
    batch, m, k = 5, 20, 24
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    bm = np.ascontiguousarray(b.transpose(0, 2, 1)) if tb else b
    sb = (0, k * n, 1, k) if tb else (0, k * n, n, 1)
    spec = GemmSpec(batch, m, n, k, (0, 0, k, 1), sb)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    for mma in _paths(device):
        for knobs in (SMALL, SPLIT_K):
            got, _ = _run(device, spec, {**knobs, "MMA": mma, "FOLD": 1}, a, bm)
            assert _rel_err(got, ref) < 1e-6
    with pytest.raises(UnsupportedError, match="FOLD=1 needs an A shared"):
        gemm.render_opencl(GemmSpec(batch, m, n, k, (0, m * k, k, 1), sb), {**SMALL, "FOLD": 1})


@pytest.mark.parametrize("device", CL_DEVICES)
def test_plans_use_the_template_with_fused_epilogues(device, monkeypatch):
    """Convolution (im2col + batched GEMM + bias + relu) and a linear layer through whole plans: the kernel names
    show the tensor-core template was chosen, and the results match PyTorch."""
    dev = get_device(device)
    mma = _paths(device)[-1]

    def knobs(device: object, kind: str, spec: GemmSpec) -> dict[str, int]:
        shared_a = spec.batch > 1 and spec.a[1] == 0 and spec.a_inner == 0  # the convolution: images fold into N
        return {**WIDE, "MMA": mma, "FOLD": int(shared_a)}

    monkeypatch.setattr(plait.tune, "_heuristic", knobs)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 11, 9), dtype=np.float32)
    w = rng.standard_normal((12, 5, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(12, dtype=np.float32)
    lw = rng.standard_normal((7, 12 * 11 * 9), dtype=np.float32) * 0.05

    def net(x: plait.Tensor, w: plait.Tensor, bias: plait.Tensor, lw: plait.Tensor) -> plait.Tensor:
        y = plait.nn.functional.conv2d(x, w, bias, padding=1).relu()
        return y.reshape(2, -1) @ lw.T

    fn = plait.jit(net, device=device)
    got = fn(x, w, bias, lw)
    want = torch.relu(torch.nn.functional.conv2d(*(torch.from_numpy(v) for v in (x, w, bias)), padding=1))
    want = want.reshape(2, -1) @ torch.from_numpy(lw).T
    assert_close(got, want.numpy(), "float32", f"conv + linear on {device}", tol_scale=10)
    plan, _ = fn.plan_for([x, w, bias, lw])
    kind = "GEMM3XTF32_" if mma else "GEMM3XTF32EMU_"
    names = [k.name for k in plan.kernels]
    assert sum(name.startswith(kind) for name in names) == 2, names
    # the plan's kernels build as one program (shared helpers defined once), not one by one after a failed build
    tc = [k for k in plan.kernels if k.name.startswith(kind)]
    dev.compile(join_sources([(k.source, k.name) for k in tc]), tc[1].name)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_mma_probe(device):
    """The probe answers for every device; where it builds PTX it must also compute the right product, and on a
    driver without inline PTX (PoCL on a CPU) the probe kernel itself fails to build and says so."""
    dev = get_device(device)
    why = mma_tf32_unsupported(dev)
    if why is None:
        assert run_probe(dev) is None
    elif not dev.info.extra.get("gpu"):
        reason = run_probe(dev)
        assert reason is not None and "mma.sync probe" in reason, reason


def test_tensor_core_knobs_are_refused_without_tensor_cores():
    """A cached tensor-core configuration on a device whose probe failed raises instead of running elsewhere."""
    dev = get_device("cpu")
    with pytest.raises(DeviceError, match="tensor cores"):
        check_device(dev, {"V": 3, "MMA": 1})
    check_device(dev, {"V": 3, "MMA": 0})  # the portable twin needs no probe


def test_bad_tiles_are_refused():
    with pytest.raises(UnsupportedError, match="WM % 16"):
        check_knobs({"BM": 64, "BN": 64, "BK": 16, "WM": 24, "WN": 32})
    with pytest.raises(UnsupportedError, match="WM % 16"):
        check_knobs({"BM": 64, "BN": 64, "BK": 8, "WM": 32, "WN": 32, "KS": 2})


@pytest.mark.parametrize(
    ("batch", "m", "n", "k"),
    [
        (1, 4096, 4096, 4096),
        (64, 512, 49, 4608),
        (64, 64, 3136, 576),
        (1, 512, 49, 4608),
        (1, 64, 3136, 576),
        (1, 16, 7, 3),
        (64, 1024, 196, 256),
        (3, 17, 100, 9),
    ],
)
def test_heuristic_and_candidates_are_valid(batch, m, n, k):
    """Every configuration plans or tuning may pick is a runnable tile shape within 48 KB of local memory."""
    from plait.tune import GEMM_CANDIDATES, _tc_candidates, _tc_heuristic

    spec = GemmSpec(batch, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    picks = [_tc_heuristic(spec), *_tc_candidates(spec)]
    for knobs in [*picks, *GEMM_CANDIDATES["tc"], *GEMM_CANDIDATES["tc_small"]]:
        check_knobs({**TC_DEFAULT, **knobs})
        assert local_bytes(knobs) <= 48 * 1024, knobs
        assert gemm.render_opencl(spec, {**knobs, "MMA": 0}).name.startswith("GEMM3XTF32EMU_")


def test_tuning_candidates_follow_the_product():
    """Tuning times only what can win: few-tile products get the small tiles, large ones the big tiles, rows are
    never padded by half, narrow per-image widths also try the batch folded into the columns, and a convolution
    also tries the heuristic's tiles without the k-table."""
    from plait.graph.ops.conv import Window
    from plait.tune import GEMM_CANDIDATES, _tc_candidates, _tc_heuristic

    def spec(batch: int, m: int, n: int, k: int, conv: Window | None = None) -> GemmSpec:
        return GemmSpec(batch, m, n, k, (0, 0, k, 1), (0, k * n, n, 1), conv=conv)

    assert _tc_candidates(spec(1, 512, 49, 4608)) == GEMM_CANDIDATES["tc_small"]
    big = _tc_candidates(spec(64, 256, 3136, 2304))
    assert big == GEMM_CANDIDATES["tc"]
    assert _tc_heuristic(spec(64, 256, 3136, 2304)) == {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64}
    # alexnet's 192 rows: 128-row tiles would pad them by a third, so the heuristic takes 64-row tiles
    assert _tc_heuristic(spec(64, 192, 729, 1600))["BM"] == 64
    assert all(c["BM"] <= 64 for c in _tc_candidates(spec(64, 64, 3136, 576)))
    folded = _tc_candidates(spec(64, 512, 196, 4608))
    assert len(folded) == 2 * len({str(c) for c in folded if "FOLD" not in c}) and any(c.get("FOLD") for c in folded)
    win = Window(64, 256, 56, 56, 3, 3, 1, 1, 1, 1)
    conv = spec(64, 256, 3136, 2304, win)
    assert _tc_candidates(conv)[-1] == {**_tc_heuristic(conv), "GT": 0}


@pytest.mark.parametrize(
    ("shape", "tile"),
    [
        ((1, 256, 200704, 2304), (128, 256, 64, 64)),  # vgg16 b64, batch folded: 128x256 won by 1.14x
        ((1, 256, 10816, 3456), (64, 128, 32, 64)),  # alexnet b64: 170 work-groups of 128x128, 64x128 won by 1.31x
        ((1, 128, 50176, 1152), (128, 128, 32, 64)),  # resnet18 b64: 392 work-groups, eight warps won by 1.39x
        ((1, 512, 3136, 4608), (64, 64, 32, 32)),  # resnet18 b64's last stage: 64x64 with BK 32 won by 1.17x
        ((1, 256, 3136, 2304), (64, 32, 32, 16)),  # vgg16 b1: 64x32 won by 1.28x
        ((64, 256, 3136, 2304), (128, 128, 64, 64)),  # the batched sweep's fastest
    ],
)
def test_heuristic_follows_the_tuned_winners(shape, tile):
    """The heuristic picks, for the target models' products, the tiles `plait tune --model` found fastest on an H100
    (docs/benchmarks.md), so an untuned device starts from them."""
    from plait.tune import _tc_heuristic

    batch, m, n, k = shape
    knobs = _tc_heuristic(GemmSpec(batch, m, n, k, (0, 0, k, 1), (0, k * n, n, 1)))
    assert (knobs["BM"], knobs["BN"], knobs["WM"], knobs["WN"]) == tile, knobs
