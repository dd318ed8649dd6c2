"""Winograd F(2,3) convolutions on OpenCL devices (plait/codegen/winograd_cl.py) against PyTorch in float64: tile
edges, padding 0, 1 and 2, batches, channel counts off the vector width, the 16 products on the 3xTF32 GEMM (its
portable twin where the device has no tensor cores) and on the FP32 template or GEMV, fused epilogues, the weight
transform run once per plan for constant weights and per call for weights that are plan inputs or eager leaves,
and the per-layer choice of PLAIT_WINOGRAD_CL (default 'auto').

Tolerance: the transforms add inputs before the products (F(2,3)'s coefficients are 0, +-1 and 1/2), so the FP32
rounding error grows a little past a direct sum's: every output element must be within TOL times the largest
magnitude of the float64 reference (the implicit GEMM meets about 1e-6 of it on the same data).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
import plait.tune
import plait.tune.model
from plait import settings
from plait.codegen import winograd_cl
from plait.codegen.gemm import GemmSpec
from plait.codegen.gemm_tc import mma_tf32_unsupported
from plait.errors import PlaitError
from plait.graph.ops.conv import Window
from plait.runtime import get_device
from tests.conftest import DEVICES

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
TOL = 1e-5
TC = {"V": 3, "BM": 32, "BN": 32, "BK": 16, "WM": 16, "WN": 16}  # small tensor-core tiles: edges in every product

GEOMETRIES = [  # n, c, k, h, w, padding
    (1, 16, 24, 9, 11, 1),  # output tiles cut by both edges (odd output sizes)
    (3, 8, 30, 14, 14, 1),  # batch > 1
    (2, 5, 7, 6, 5, 0),  # no padding, channels off the vector width, few output channels (GEMV products)
    (1, 4, 40, 7, 7, 2),  # padding 2: the output is larger than the input
    (2, 33, 20, 12, 8, 1),
]


def _data(n, c, k, h, w, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    return x, wt, b


def _ref(x, w, b, padding):
    t = [torch.tensor(v, dtype=torch.float64) for v in (x, w, b)]
    return torch.relu(torch.nn.functional.conv2d(*t, padding=padding)).numpy()


def _check(got, want, what):
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= TOL * scale, f"{what}: max error {err:.3g} > {TOL} x {scale:.3g}"


def _kinds(plan):
    return [k.name.split("_")[0] for k in plan.kernels]


def _tensor_cores(device, monkeypatch):
    """Run every product on the 3xTF32 template (the mma.sync path where the device has it, else its twin)."""
    mma = 0 if mma_tf32_unsupported(get_device(device)) else 1
    monkeypatch.setattr(plait.tune, "_heuristic", lambda dev, kind, spec: {**TC, "MMA": mma})
    return "GEMM3XTF32" if mma else "GEMM3XTF32EMU"


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("tc", [True, False], ids=["3xtf32", "heuristic"])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_winograd_cl_matches_torch(device, tc, geo, monkeypatch):
    n, c, k, h, w, pad = geo
    gemm_kind = _tensor_cores(device, monkeypatch) if tc else None
    x, wt, b = _data(n, c, k, h, w)
    weight, bias = plait.tensor(wt, device=device), plait.tensor(b, device=device)
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=pad).relu(), device=device)
        plan, _ = f.plan_for([x])
    # the constant weight was transformed when the plan was built; bias and ReLU run in the output transform
    kinds = _kinds(plan)
    assert kinds[0] == "WINOIN2" and kinds[2] == "WINOOUT2" and len(kinds) == 3, kinds
    if gemm_kind:
        assert kinds[1] == gemm_kind
    _check(f(x), _ref(x, wt, b, pad), f"F(2,3) {geo} on {device}")
    x2 = _data(n, c, k, h, w, seed=1)[0]
    _check(f(x2), _ref(x2, wt, b, pad), f"F(2,3) {geo} on {device}, second input")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_winograd_cl_batchnorm_residual_epilogue(device, monkeypatch):
    """Inference BN (per-channel scale and shift), a residual add and ReLU fuse into the output transform."""
    _tensor_cores(device, monkeypatch)
    n, c, k, h, w = 2, 24, 40, 10, 13
    x, wt, _b = _data(n, c, k, h, w)
    rng = np.random.default_rng(2)
    res = rng.standard_normal((n, k, h, w)).astype(np.float32)
    scale, shift = rng.uniform(0.5, 2, k).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    weight = plait.tensor(wt, device=device)
    sc = plait.tensor(scale.reshape(k, 1, 1), device=device)
    sh = plait.tensor(shift.reshape(k, 1, 1), device=device)

    def fn(t, r):
        return (F.conv2d(t, weight, None, padding=1) * sc + sh + r).relu()

    with settings.override(PLAIT_WINOGRAD_CL="2"):
        f = plait.jit(fn, device=device)
        plan, _ = f.plan_for([x, res])
    assert _kinds(plan)[-1] == "WINOOUT2" and len(plan.kernels) == 3, _kinds(plan)
    ref = torch.nn.functional.conv2d(
        torch.tensor(x, dtype=torch.float64), torch.tensor(wt, dtype=torch.float64), None, padding=1
    )
    ref = torch.relu(
        ref * torch.tensor(scale, dtype=torch.float64).reshape(k, 1, 1)
        + torch.tensor(shift, dtype=torch.float64).reshape(k, 1, 1)
        + torch.tensor(res, dtype=torch.float64)
    )
    _check(f(x, res), ref.numpy(), "BN + residual + ReLU epilogue")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_winograd_cl_weight_as_plan_input(device, monkeypatch):
    """A weight that is a plan input is transformed inside the plan on every call, so a new weight is used."""
    _tensor_cores(device, monkeypatch)
    n, c, k, h, w = 2, 20, 36, 12, 11
    x, wt, b = _data(n, c, k, h, w)
    bias = plait.tensor(b, device=device)
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        f = plait.jit(lambda t, u: F.conv2d(t, u, bias, padding=1).relu(), device=device)
        plan, _ = f.plan_for([x, wt])
    assert _kinds(plan)[:2] == ["WINOW2", "WINOIN2"], _kinds(plan)
    _check(f(x, wt), _ref(x, wt, b, 1), "first weight")
    wt2 = _data(n, c, k, h, w, seed=3)[1]
    _check(f(x, wt2), _ref(x, wt2, b, 1), "second weight")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_winograd_cl_eager_replays_with_new_weights(device):
    """Eager convolutions replay a cached recipe with new leaves; the weight transform is part of it."""
    n, c, k, h, w = 2, 12, 30, 8, 9
    x, wt, b = _data(n, c, k, h, w)
    wt2 = _data(n, c, k, h, w, seed=4)[1]
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        xt, bt = plait.tensor(x, device=device), plait.tensor(b, device=device)
        for weight in (wt, wt2):
            out = F.conv2d(xt, plait.tensor(weight, device=device), bt, padding=1).relu().numpy()
            _check(out, _ref(x, weight, b, 1), "eager")


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize(("c", "winograd"), [(128, True), (32, False)])
def test_winograd_cl_default_choice(device, c, winograd):
    """By default ('auto') a 128-channel layer with 2048 tiles runs with Winograd, a 32-channel one on the GEMM."""
    n, k, h, w = 2, 128, 64, 64
    x, wt, b = _data(n, c, k, h, w)
    weight, bias = plait.tensor(wt, device=device), plait.tensor(b, device=device)
    f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=1).relu(), device=device)
    plan, _ = f.plan_for([x])
    assert any(kind.startswith("WINO") for kind in _kinds(plan)) == winograd, _kinds(plan)
    _check(f(x), _ref(x, wt, b, 1), f"default choice, {c} channels in")


def _spec(n, c, k, h, w, stride=1, pad=1):
    win = Window(n, c, h, w, 3, 3, stride, stride, pad, pad)
    return GemmSpec(n, k, win.oh * win.ow, c * 9, (0, 0, c * 9, 1), (0, 0, 0, 0), n, 0, c * h * w, win)


@pytest.mark.parametrize(
    ("geo", "stride", "chosen"),
    [
        ((64, 256, 256, 14, 14), 1, True),  # resnet18's third stage at batch 64: 3136 tiles
        ((64, 512, 512, 7, 7), 1, True),  # its last stage: 1024 tiles
        ((64, 32, 64, 56, 56), 1, False),  # 32 channels: the transforms' traffic outweighs the products saved
        ((1, 512, 512, 14, 14), 1, False),  # batch 1 at 14x14: 49 tiles
        ((1, 256, 256, 28, 28), 1, False),  # batch 1 at 28x28 (resnet's 128+-channel layers are this size or less)
        ((1, 512, 512, 28, 28), 1, True),  # batch 1 at 28x28 with 512 channels (vgg16)
        ((1, 256, 256, 56, 56), 1, True),  # batch 1, vgg16's 56x56 layers: 784 tiles
        ((1, 128, 128, 112, 112), 1, True),  # batch 1, vgg16's 112x112 layers
        ((16, 512, 512, 7, 7), 1, False),  # too few tiles (256)
        ((64, 256, 256, 28, 28), 2, False),  # strided
    ],
)
def test_winograd_cl_auto_choice(geo, stride, chosen):
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        plan = winograd_cl.pick(_spec(*geo, stride=stride))
    assert (plan is not None) == chosen
    if plan is not None:
        n, c, k, h, w = geo
        g = plan.gemm_spec()
        m = plan.m  # 2, or 4 where F(4, 3) takes the layer (tests/ops/test_winograd43_cl.py)
        assert (g.batch, g.m, g.k) == ((m + 2) ** 2, k, c) and g.n >= n * -(-h // m) * -(-w // m) and g.n % 4 == 0


def test_winograd_cl_setting_rejects_unknown_value():
    with settings.override(PLAIT_WINOGRAD_CL="fast"), pytest.raises(PlaitError, match="PLAIT_WINOGRAD_CL='fast'"):
        winograd_cl.pick(_spec(2, 64, 64, 8, 8))


@pytest.fixture
def fresh_tuning(tmp_path, monkeypatch):
    """An empty tuning cache, so no other test's winners leak in and none of these leak out."""
    monkeypatch.setattr(plait.tune, "_memo", {})
    # the first four configurations of each search: every step of tuning runs, with a fraction of the cold builds
    full = plait.tune.model.candidates
    monkeypatch.setattr(plait.tune.model, "candidates", lambda device, spec=None: full(device, spec)[:4])
    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        yield


@pytest.mark.parametrize("device", CL_DEVICES)
def test_winograd_cl_products_are_tuned(device, fresh_tuning):
    """`plait tune` searches the 16 products like any other GEMM; the plan built after it reads the cached knobs
    and still matches torch."""
    from plait.tune.model import tune_plan

    n, c, k, h, w = 2, 16, 20, 10, 9
    x, wt, b = _data(n, c, k, h, w)
    weight, bias = plait.tensor(wt, device=device), plait.tensor(b, device=device)
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=1).relu(), device=device)
        plan, _ = f.plan_for([x])
        f(x)
        report = tune_plan(plan, budget_s=120, reps=2, log=lambda s: None)
        assert [t.shape for t in report.tuned] == [f"16x{k}x52x{c}"]  # 50 tiles, padded to a multiple of 4
        g = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=1).relu(), device=device)
        _check(g(x), _ref(x, wt, b, 1), "after tuning")
