"""Winograd F(4,3) convolutions on OpenCL devices (plait/codegen/winograd_cl.py with a plan's `m` = 4: 4x4 outputs
per 6x6 input tile, 36 products) against PyTorch in float64: tile edges cut by odd output sizes, padding 0, 1 and
2, the 36 products on the 3xTF32 template and on the heuristic's, a training step's forward, input gradient and
(F(2,3)) weight gradient, and the per-layer choice of PLAIT_WINOGRAD_CL='auto'.

Tolerance: F(4,3)'s transforms have coefficients up to 8 (A^T) and 1/24 (G), so FP32 rounding grows about ten times
past F(2,3)'s (1e-5 of the reference's largest magnitude there): TOL is 5e-5, and a test checks F(4,3) stays within
it while also erring more than F(2,3) does on the same data (so the F(4,3) path really ran).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen import winograd_cl
from plait.codegen.gemm import GemmSpec
from plait.graph import autodiff
from plait.graph.ops.conv import Window
from plait.schedule.plan import Plan
from tests.conftest import DEVICES
from tests.ops.test_winograd_cl import _data, _kinds, _ref, _tensor_cores

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
TOL = 5e-5

GEOMETRIES = [  # n, c, k, h, w, padding
    (1, 16, 24, 9, 11, 1),  # output tiles cut by both edges (9 and 11 outputs: 3 and 1 spare rows, columns)
    (2, 5, 7, 6, 5, 0),  # no padding (4x3 outputs), channels off the vector width, GEMV products
    (1, 4, 40, 7, 7, 2),  # padding 2: the output is larger than the input
    (2, 33, 20, 13, 10, 1),
]


def _err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def _conv(device: str, x, wt, b, pad: int, mode: str):
    weight, bias = plait.tensor(wt, device=device), plait.tensor(b, device=device)
    with settings.override(PLAIT_WINOGRAD_CL=mode):
        f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=pad).relu(), device=device)
        plan, _ = f.plan_for([x])
    return f(x), _kinds(plan)


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_f43_matches_torch(device, geo):
    n, c, k, h, w, pad = geo
    x, wt, b = _data(n, c, k, h, w)
    got, kinds = _conv(device, x, wt, b, pad, "4")
    assert kinds[0] == "WINOIN4" and kinds[2] == "WINOOUT4" and len(kinds) == 3, kinds
    err = _err(got, _ref(x, wt, b, pad))
    assert err <= TOL, f"F(4,3) {geo} on {device}: max error {err:.3g} of the largest magnitude > {TOL}"


@pytest.mark.parametrize("device", CL_DEVICES)
def test_f43_on_tensor_cores_rounds_like_fp32(device, monkeypatch):
    """On the 3xTF32 products F(4,3) stays within TOL, and errs more than F(2,3) on the same layer."""
    gemm_kind = _tensor_cores(device, monkeypatch)
    n, c, k, h, w = 2, 48, 40, 14, 14
    x, wt, b = _data(n, c, k, h, w)
    ref = _ref(x, wt, b, 1)
    got4, kinds = _conv(device, x, wt, b, 1, "4")
    got2, _ = _conv(device, x, wt, b, 1, "2")
    assert kinds == ["WINOIN4", gemm_kind, "WINOOUT4"], kinds
    err4, err2 = _err(got4, ref), _err(got2, ref)
    assert err2 < err4 <= TOL, (err2, err4)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_f43_training_step_parts(device):
    """A training convolution under '4': the forward, the input gradient (weight transformed per call) and the weight
    gradient run F(4,3); all three match torch."""
    n, c, k, h, w = 2, 12, 16, 11, 10
    x, wt, _ = _data(n, c, k, h, w)
    g = np.random.default_rng(5).standard_normal((n, k, h, w)).astype(np.float32)
    xp, wp = plait.tensor(x, device=device, requires_grad=True), plait.tensor(wt, device=device, requires_grad=True)
    with settings.override(PLAIT_WINOGRAD_CL="4"):
        step = plait.jit(lambda a, u: (F.conv2d(a, u, padding=1) * plait.tensor(g, device=device)).sum(), device=device)
        plan, _ = step.plan_for([x, wt])
        out = F.conv2d(xp, wp, padding=1)
        (out * plait.tensor(g, device=device)).sum().backward()
    xt, wtt = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, wt))
    ref = torch.nn.functional.conv2d(xt, wtt, padding=1)
    (ref * torch.tensor(g, dtype=torch.float64)).sum().backward()
    assert "WINOOUT4F" in _kinds(plan) or "WINOOUT4" in _kinds(plan), _kinds(plan)
    for name, got, want in (
        ("forward", out.numpy(), ref.detach().numpy()),
        ("input gradient", xp.grad.numpy(), xt.grad.numpy()),
        ("weight gradient", wp.grad.numpy(), wtt.grad.numpy()),
    ):
        assert _err(got, want) <= TOL, f"{name}: {_err(got, want):.3g}"


def _spec(n, c, k, h, w):
    win = Window(n, c, h, w, 3, 3, 1, 1, 1, 1)
    return GemmSpec(n, k, win.oh * win.ow, c * 9, (0, 0, c * 9, 1), (0, 0, 0, 0), n, 0, c * h * w, win)


@pytest.mark.parametrize(
    ("geo", "m"),
    [
        ((64, 64, 64, 224, 224), 4),  # vgg16's conv1_2 at batch 64: 200704 tiles of 4x4 outputs
        ((64, 64, 64, 56, 56), 4),  # resnet's first stage
        ((64, 512, 512, 7, 7), 4),  # 256 tiles of 4x4 outputs
        ((1, 256, 256, 56, 56), 4),  # batch 1 at 56x56: 196 tiles
        ((1, 512, 512, 28, 28), 2),  # batch 1 at 28x28: 49 tiles of 4x4 outputs, F(2,3)'s wide-layer rule
        ((1, 256, 256, 28, 28), 0),  # neither rule
        ((64, 32, 64, 56, 56), 0),  # 32 channels in: the implicit GEMM
    ],
)
def test_f43_auto_choice(geo, m):
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        plan = winograd_cl.pick(_spec(*geo))
    assert (plan.m if plan else 0) == m
    if plan is not None:
        n, c, k, h, w = geo
        g = plan.gemm_spec()
        assert (g.batch, g.m, g.k) == ((m + 2) ** 2, k, c) and g.n >= n * -(-h // m) * -(-w // m) and g.n % 4 == 0


@pytest.mark.parametrize(
    ("geo", "knobs"),
    [
        ((64, 64, 64, 224, 224), winograd_cl.F43_NARROW_KNOBS),  # vgg16's conv1_2 at batch 64: 36x64x200704x64
        ((64, 64, 64, 56, 56), winograd_cl.F43_NARROW_KNOBS),  # resnet's first stage: 36x64x12544x64
        ((1, 64, 64, 224, 224), winograd_cl.R5_NARROW_KNOBS),  # batch 1: 3136 columns, not swept
        ((64, 128, 128, 28, 28), winograd_cl.F43_FEW_KNOBS),  # 36x128x3136x128: 900 128x128 tiles
        ((64, 256, 256, 14, 14), winograd_cl.F43_FEW_KNOBS),  # 36x256x1024x256: 576 tiles
        ((64, 512, 512, 14, 14), None),  # K 512: the generic rule
        ((64, 256, 256, 56, 56), None),  # 7056 tiles: the generic rule
    ],
)
def test_f43_product_tiles(geo, knobs):
    """F(4,3)'s 36 products take winograd_cl.product_knobs' F(4,3) tiles where the sweep found them faster: 64 rows
    over K 64 the 64x64 BK 32 KS 2 tiles at batch 64, few 128x128 tiles over K <= 256 the 128x64 ones; the tensor-core
    heuristic asks product_knobs first."""
    from plait.tune import _tc_heuristic

    with settings.override(PLAIT_WINOGRAD_CL="4"):
        plan = winograd_cl.pick(_spec(*geo))
    assert plan is not None and plan.m == 4
    g = plan.gemm_spec()
    assert winograd_cl.product_knobs(g) == knobs
    if knobs is not None:
        assert _tc_heuristic(g) == knobs


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("mode", ["2", "4"])
def test_f43_forward_with_f23_weight_gradient_in_one_plan(device, mode):
    """In one plan, an F(4,3) forward cannot take an F(2,3) weight gradient's input tiles (6x6 against 4x4), so it
    makes its own (two input transforms, one of each size); an F(4,3) weight gradient's it takes (under '4', both
    F(4,3): one). The output and weight gradient match torch either way."""
    rng = np.random.default_rng(1)
    xa = rng.standard_normal((2, 8, 9, 10)).astype(np.float32)
    wa = (rng.standard_normal((16, 8, 3, 3)) / np.sqrt(72)).astype(np.float32)
    ga = rng.standard_normal((2, 16, 9, 10)).astype(np.float32)
    x = plait.tensor(xa, device=device, requires_grad=True)
    wt = plait.tensor(wa, device=device, requires_grad=True)
    with settings.override(PLAIT_WINOGRAD_CL=mode):  # the weight gradient's plan is made with the convolution
        out = F.conv2d(x, wt, padding=1)
        loss = (out * plait.tensor(ga, device=device)).sum()
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
        node = autodiff.gradients(loss.node, seed, [wt.node])[wt.node.uid]
    with settings.override(PLAIT_WINOGRAD_CL="4"):  # the forward's as the plan is scheduled
        plan = Plan([out.node, node])
    ms = sorted(it.out.arg.m for it in plan.items if it.out.op == "winograd_cl_input")
    assert ms == ([2, 4] if mode == "2" else [4]), ms
    got_out, got_w = plan()
    wr = torch.tensor(wa, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.conv2d(torch.tensor(xa, dtype=torch.float64), wr, padding=1)
    (ref * torch.tensor(ga, dtype=torch.float64)).sum().backward()
    assert wr.grad is not None
    assert _err(got_out, ref.detach().numpy()) <= TOL and _err(got_w, wr.grad.numpy()) <= TOL


@pytest.mark.parametrize(
    ("geo", "m"),
    [
        ((64, 128, 128, 28, 28), 4),  # resnet50's 128-channel stage at batch 64
        ((64, 512, 512, 7, 7), 4),  # 256 tiles of 4x4 outputs
        ((64, 64, 128, 112, 112), 4),  # vgg16's conv2_1
        ((64, 64, 64, 224, 224), 4),  # vgg16's conv1_2: 64 channels, 200704 tiles (R43_WGRAD_NARROW_MIN_TILES)
        ((64, 64, 64, 56, 56), 0),  # 64 channels, 12544 tiles: F(2,3)'s rule keeps the direct product
        ((1, 512, 512, 28, 28), 0),  # batch 1: 196 tiles of 2x2 outputs, under MIN_TILES
    ],
)
def test_f43_weight_gradient_choice(geo, m):
    """Under 'auto' (R43_WGRAD) a 3x3 weight gradient that F(2,3)'s rule gives Winograd runs as F(4,3) where
    `_auto43` says, and so does a 64-channel one with R43_WGRAD_NARROW_MIN_TILES tiles; '2' keeps F(2,3), '4' always
    F(4,3)."""
    n, c, k, h, w = geo
    win = Window(n, c, h, w, 3, 3, 1, 1, 1, 1)
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        p = winograd_cl.wgrad_plan(win, k)
    assert (p.m if p else 0) == (m if winograd_cl.R43_WGRAD or not m else 2)
    if p is not None:
        assert (p.r, p.xis, p.tiles) == (3, p.alpha**2, n * -(-h // p.m) * -(-w // p.m))
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        assert winograd_cl.wgrad_plan(win, k).m == 2
    with settings.override(PLAIT_WINOGRAD_CL="4"):
        assert winograd_cl.wgrad_plan(win, k).m == 4
