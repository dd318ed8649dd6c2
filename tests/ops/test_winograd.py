"""Winograd F(2,3) and F(4,3) convolutions on the `cpu` device (plait/codegen/winograd_c.py) against PyTorch in
float64: tile edges, padding, batches, channel counts off the register tile, fused epilogues, the weight transform
run once per compiled plan for constant weights and per replay for weights that are plan inputs, and the per-layer
choice.

Tolerance: Winograd's transforms add and scale inputs before the products, so its FP32 rounding error grows with
the transform's coefficients (up to 8 in F(4,3)'s output transform) rather than staying at a direct sum's. Every
output element must be within TOL[m] times the largest reference magnitude of its reference (direct convolution in
float64); the implicit GEMM meets 1e-6 of it on the same data.
"""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen import gemm_c
from plait.errors import PlaitError

TOL = {2: 1e-5, 4: 5e-5}

GEOMETRIES = [  # n, c, k, h, w, padding
    (1, 16, 24, 9, 11, 1),  # output tiles cut by both edges
    (2, 8, 30, 14, 14, 1),  # two images in one tile block
    (3, 5, 7, 6, 5, 0),  # no padding, fewer output channels than a register tile
    (1, 4, 50, 7, 7, 2),  # padding 2: output larger than the input
    (2, 33, 20, 12, 8, 1),  # input channels off the vector width
    (1, 64, 64, 16, 16, 1),
]


def _ref(x, w, b, padding, residual=None):
    out = torch.nn.functional.conv2d(
        torch.tensor(x, dtype=torch.float64),
        torch.tensor(w, dtype=torch.float64),
        torch.tensor(b, dtype=torch.float64),
        padding=padding,
    )
    if residual is not None:
        out = out + torch.tensor(residual, dtype=torch.float64)
    return torch.relu(out).numpy()


def _check(got, want, m, what):
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= TOL[m] * scale, f"{what}: max error {err:.3g} > {TOL[m]} x {scale:.3g}"


def _data(n, c, k, h, w, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    return x, wt, b


def _kinds(plan):
    return [k.name.split("_")[0] for k in plan.kernels]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_winograd_matches_torch(m, geo):
    n, c, k, h, w, pad = geo
    x, wt, b = _data(n, c, k, h, w)
    weight, bias = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    with settings.override(PLAIT_WINOGRAD=str(m)):
        f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=pad).relu(), device="cpu")
        plan, _ = f.plan_for([x])
    # one kernel per replay: bias and ReLU run in its epilogue, and the constant weight was transformed at build
    assert _kinds(plan) == [f"WINO{m}"]
    _check(f(x), _ref(x, wt, b, pad), m, f"F({m},3) {geo}")
    x2 = _data(n, c, k, h, w, seed=1)[0]
    _check(f(x2), _ref(x2, wt, b, pad), m, f"F({m},3) {geo}, second input")


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_residual_and_batchnorm_epilogue(m):
    """Inference BN (per-channel scale and shift), a residual add and ReLU fuse into the Winograd kernel."""
    n, c, k, h, w = 2, 24, 40, 10, 13
    x, wt, _b = _data(n, c, k, h, w)
    rng = np.random.default_rng(2)
    res = rng.standard_normal((n, k, h, w)).astype(np.float32)
    scale, shift = rng.uniform(0.5, 2, k).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    weight = plait.tensor(wt, device="cpu")
    sc, sh = plait.tensor(scale.reshape(k, 1, 1), device="cpu"), plait.tensor(shift.reshape(k, 1, 1), device="cpu")

    def fn(t, r):
        return (F.conv2d(t, weight, None, padding=1) * sc + sh + r).relu()

    with settings.override(PLAIT_WINOGRAD=str(m)):
        f = plait.jit(fn, device="cpu")
        plan, _ = f.plan_for([x, res])
    assert _kinds(plan) == [f"WINO{m}"]
    ref = torch.nn.functional.conv2d(
        torch.tensor(x, dtype=torch.float64), torch.tensor(wt, dtype=torch.float64), None, padding=1
    )
    ref = torch.relu(
        ref * torch.tensor(scale, dtype=torch.float64).reshape(k, 1, 1)
        + torch.tensor(shift, dtype=torch.float64).reshape(k, 1, 1)
        + torch.tensor(res, dtype=torch.float64)
    )
    _check(f(x, res), ref.numpy(), m, "BN + residual + ReLU epilogue")


def test_winograd_weight_as_plan_input_is_transformed_every_call():
    """A weight that is a plan input (torch.compile lifts parameters to inputs) is transformed inside the plan, so a
    new weight on the next call is used, not the first call's transform."""
    n, c, k, h, w = 1, 20, 36, 12, 12
    x, wt, b = _data(n, c, k, h, w)
    bias = plait.tensor(b, device="cpu")
    with settings.override(PLAIT_WINOGRAD="4"):
        f = plait.jit(lambda t, u: F.conv2d(t, u, bias, padding=1).relu(), device="cpu")
        plan, _ = f.plan_for([x, wt])
    assert _kinds(plan) == ["WINOW4", "WINO4"]
    _check(f(x, wt), _ref(x, wt, b, 1), 4, "first weight")
    wt2 = _data(n, c, k, h, w, seed=3)[1]
    _check(f(x, wt2), _ref(x, wt2, b, 1), 4, "second weight")


def test_winograd_eager_replays_transform_with_new_weights():
    """Eager (lazily realized) convolutions replay a cached recipe with new leaves: the weight transform is part of
    the recipe, so a changed weight gives the new result."""
    n, c, k, h, w = 2, 12, 30, 8, 9
    x, wt, b = _data(n, c, k, h, w)
    wt2 = _data(n, c, k, h, w, seed=4)[1]
    with settings.override(PLAIT_WINOGRAD="2"):
        xt, bt = plait.tensor(x, device="cpu"), plait.tensor(b, device="cpu")
        for weight in (wt, wt2):
            out = F.conv2d(xt, plait.tensor(weight, device="cpu"), bt, padding=1).relu().numpy()
            _check(out, _ref(x, weight, b, 1), 2, "eager")


@pytest.mark.parametrize(
    ("geo", "stride", "want"),
    [
        ((2, 64, 64, 16, 16), 1, "WINO4"),  # 32 tiles of 4x4: F(4,3)
        # batch-1 14x14: 16 tiles of 4x4 with 8-float vectors (winograd_c.MIN_TILES_F4), else 49 of 2x2
        ((1, 64, 64, 14, 14), 1, "WINO2" if gemm_c.VW == 16 else "WINO4"),
        ((1, 64, 64, 7, 7), 1, "WINO2"),  # batch-1 7x7: 4 tiles of 4x4 would pad a panel 4x; 16 of 2x2
        # ... unless U (16 MB) leaves L2 with one panel of tiles to share it, where 16-float vectors run the GEMM
        # near the core's peak (8-float ones: F(2,3) still wins, winograd_c.F2_BIG_U_TILES)
        ((1, 512, 512, 7, 7), 1, "CONV" if gemm_c.VW == 16 else "WINO2"),
        ((1, 16, 64, 16, 16), 1, "CONV"),  # few input channels: transforms cost what they save
        ((1, 64, 64, 16, 16), 2, "CONV"),  # strided: no Winograd
        ((1, 64, 64, 3, 3), 1, "CONV"),  # too few tiles
    ],
)
def test_winograd_choice(geo, stride, want):
    n, c, k, h, w = geo
    x, wt, b = _data(n, c, k, h, w)
    weight, bias = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    with settings.override(PLAIT_WINOGRAD="auto"):
        f = plait.jit(lambda t: F.conv2d(t, weight, bias, stride=stride, padding=1), device="cpu")
        plan, _ = f.plan_for([x])
    assert _kinds(plan) == [want]
    ref = torch.nn.functional.conv2d(
        torch.tensor(x, dtype=torch.float64),
        torch.tensor(wt, dtype=torch.float64),
        torch.tensor(b, dtype=torch.float64),
        stride=stride,
        padding=1,
    )
    _check(f(x), ref.numpy(), 4, f"auto {geo}")


def test_winograd_setting_rejects_unknown_value():
    x, wt, _b = _data(1, 64, 64, 16, 16)
    weight = plait.tensor(wt, device="cpu")
    with settings.override(PLAIT_WINOGRAD="fast"), pytest.raises(PlaitError, match="PLAIT_WINOGRAD='fast'"):
        plait.jit(lambda t: F.conv2d(t, weight, None, padding=1), device="cpu").plan_for([x])


@pytest.mark.parametrize("mode", ["2", "4", "auto"])
def test_resnet18_inference_plan_matches_torch(mode):
    """A whole network's inference plan (every 3x3 stride-1 convolution on Winograd where the mode applies it, BN
    and residual adds in its epilogues) against PyTorch eager, within 1e-3 of the largest logit as the ONNX
    benchmark checks."""
    from plait.models.torch_reference import build

    torch.manual_seed(0)
    ref_model = build("resnet18", num_classes=10).eval()
    model = plait.models.resnet18(num_classes=10).eval()
    model.load_state_dict(ref_model.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 3, 96, 96)).astype(np.float32)
    with settings.override(PLAIT_WINOGRAD=mode), plait.no_grad():
        f = plait.jit(lambda t: model(t), device="cpu")
        plan, _ = f.plan_for([x])
        got = f(x)
    assert any(k.startswith("WINO") for k in _kinds(plan))
    with torch.no_grad():
        want = ref_model(torch.tensor(x)).numpy()
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * scale)


def test_winograd_weight_computed_from_parameters_is_transformed_once():
    """A weight that the plan computes from parameters alone (here scaled per output channel, as BN folding does)
    is made once at build, and so is its Winograd transform: one kernel per replay."""
    n, c, k, h, w = 1, 20, 36, 12, 12
    x, wt, b = _data(n, c, k, h, w)
    scale = np.random.default_rng(5).uniform(0.5, 2, k).astype(np.float32)
    weight, sc = plait.tensor(wt, device="cpu"), plait.tensor(scale.reshape(k, 1, 1, 1), device="cpu")
    bias = plait.tensor(b, device="cpu")
    with settings.override(PLAIT_WINOGRAD="4"):
        f = plait.jit(lambda t: F.conv2d(t, weight * sc, bias, padding=1).relu(), device="cpu")
        plan, _ = f.plan_for([x])
    assert _kinds(plan) == ["WINO4"]
    _check(f(x), _ref(x, wt * scale.reshape(k, 1, 1, 1), b, 1), 4, "folded weight")
