"""Winograd F(2,5) and F(4,5) for 5x5 stride-1 convolutions on OpenCL (plait/codegen/winograd_cl.py with r = 5:
6x6 input tiles and 36 products per 2x2 outputs, or 8x8 tiles and 64 products per 4x4 outputs) against PyTorch in
float64: the forward with a fused epilogue, the training convolution's forward (batch folded), input gradient (a 5x5
convolution of dy with the flipped weight, which takes the same path) and weight gradient, and the per-layer choice
of PLAIT_WINOGRAD_CL.

Tolerance: F(2,5)'s transforms mix up to 6 inputs with coefficients up to 5 (B^T) and 2/3 (G), so FP32 rounding
grows past F(2,3)'s: within TOL times the largest magnitude of the float64 reference (the direct product meets
about 1e-6 of it on the same data, F(2,5) a few times that; F(4,5)'s coefficients reach 21/4 (B^T), 32/45 (G) and
8 (A^T), about 1.4x F(2,5)'s rounding on alexnet's layer)."""

from __future__ import annotations

import dataclasses

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

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
TOL = 3e-5


def _data(n: int, c: int, k: int, h: int, w: int, pad: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c, 5, 5)) / np.sqrt(25 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    g = rng.standard_normal((n, k, h + 2 * pad - 4, w + 2 * pad - 4)).astype(np.float32)
    return x, wt, b, g


def _check(got: np.ndarray, want: np.ndarray, what: str) -> None:
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= TOL * scale, f"{what}: max error {err:.3g} > {TOL} x {scale:.3g}"


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(
    "geo",
    [(2, 6, 12, 9, 11, 2), (1, 5, 7, 8, 8, 0), (3, 4, 9, 7, 6, 1)],  # n, c, k, h, w, padding
    ids=lambda g: "x".join(map(str, g)),
)
def test_f25_forward_matches_torch(device: str, m: int, geo: tuple[int, ...]) -> None:
    """F(m,5) (PLAIT_WINOGRAD_CL=m): tiles cut by both edges, padding 0 to 2, bias and ReLU in the output
    transform."""
    n, c, k, h, w, pad = geo
    x, wt, b, _ = _data(n, c, k, h, w, pad)
    weight, bias = plait.tensor(wt, device=device), plait.tensor(b, device=device)
    with settings.override(PLAIT_WINOGRAD_CL=str(m)):
        f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=pad).relu(), device=device)
        plan, _ = f.plan_for([x])
    kinds = [kern.name.split("_")[0] for kern in plan.kernels]
    assert kinds[0] == f"WINOIN{m}R5" and kinds[2] == f"WINOOUT{m}R5" and len(kinds) == 3, kinds
    t = [torch.tensor(v, dtype=torch.float64) for v in (x, wt, b)]
    _check(f(x), torch.relu(torch.nn.functional.conv2d(*t, padding=pad)).numpy(), f"F({m},5) {geo}")


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize(("m", "pad"), [(2, 2), (2, 1), (4, 2), (4, 1)])
def test_f25_training_gradients_match_torch(device: str, m: int, pad: int) -> None:
    """The training convolution's output, input gradient and weight gradient in one plan (16 output channels: the
    forward folds the batch into its columns, as in a training step), all three by F(m,5); the forward takes the
    weight gradient's input transform."""
    n, c, k, h, w = 2, 6, 16, 9, 8
    xa, wa, _, ga = _data(n, c, k, h, w, pad, seed=3)
    x = plait.tensor(xa, device=device, requires_grad=True)
    wt = plait.tensor(wa, device=device, requires_grad=True)
    with settings.override(PLAIT_WINOGRAD_CL=str(m)):
        out = F.conv2d(x, wt, padding=pad)
        loss = (out * plait.tensor(ga, device=device)).sum()
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
        grads = autodiff.gradients(loss.node, seed, [x.node, wt.node])
        plan = Plan([out.node, grads[x.node.uid], grads[wt.node.uid]])
    names = [kern.name.split("_")[0] for kern in plan.kernels]
    assert {v: names.count(v) for v in names if v.startswith("WINOIN")} == {f"WINOIN{m}R5": 2}, names  # x's, dy's
    assert f"WINODY{m}R5" in names and f"WINOWG{m}R5" in names, names
    assert f"WINOOUT{m}FR5" in names and f"WINOOUT{m}R5" in names, names  # folded forward, then the input gradient
    got_out, got_dx, got_dw = plan()
    xr = torch.tensor(xa, dtype=torch.float64, requires_grad=True)
    wr = torch.tensor(wa, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.conv2d(xr, wr, padding=pad)
    (ref * torch.tensor(ga, dtype=torch.float64)).sum().backward()
    assert xr.grad is not None and wr.grad is not None
    _check(got_out, ref.detach().numpy(), "output")
    _check(got_dx, xr.grad.numpy(), "input gradient")
    _check(got_dw, wr.grad.numpy(), "weight gradient")


def _spec(n: int, c: int, k: int, h: int, w: int, stride: int = 1, pad: int = 2) -> GemmSpec:
    win = Window(n, c, h, w, 5, 5, stride, stride, pad, pad)
    return GemmSpec(n, k, win.oh * win.ow, c * 25, (0, 0, c * 25, 1), (0, 0, 0, 0), n, 0, c * h * w, win)


@pytest.mark.parametrize(
    ("geo", "stride", "forward", "wgrad"),
    [
        # alexnet's 5x5 layer at batch 64 (12544 tiles): its inference forward (unfolded, 64 -> 192) and weight
        # gradient
        ((64, 64, 192, 27, 27), 1, True, True),
        ((64, 192, 64, 27, 27), 1, True, False),  # its input gradient (192 -> 64); 64 output channels: no wgrad
        ((1, 64, 192, 27, 27), 1, False, False),  # batch 1: 196 tiles
        ((1, 192, 64, 27, 27), 1, False, False),
        ((64, 192, 32, 27, 27), 1, False, False),  # 32 output channels
        ((64, 192, 192, 27, 27), 2, False, False),  # strided
    ],
)
def test_f25_auto_choice(geo: tuple[int, ...], stride: int, forward: bool, wgrad: bool) -> None:
    n, c, k, h, w = geo
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        plan = winograd_cl.pick(_spec(*geo, stride=stride))
        wplan = winograd_cl.wgrad_plan(Window(n, c, h, w, 5, 5, stride, stride, 2, 2), k)
    assert (plan is not None) == (forward and winograd_cl.R5_AUTO)
    assert (wplan is not None) == (wgrad and winograd_cl.R5_AUTO)
    if plan is not None:  # the forward and input gradient F(4,5) with R45_AUTO, the weight gradient with R45_WGRAD
        m = 4 if winograd_cl.R45_AUTO else 2
        assert (plan.r, plan.m, plan.alpha, plan.xis) == (5, m, m + 4, (m + 4) ** 2)
        assert wplan is None or (wplan.r, wplan.m) == (5, 4 if winograd_cl.R45_WGRAD else 2)
        g = plan.gemm_spec()
        assert (g.batch, g.m, g.k) == ((m + 4) ** 2, k, c) and g.n >= n * -((-27 // m) ** 2)
    with settings.override(PLAIT_WINOGRAD_CL="off"):
        assert winograd_cl.pick(_spec(*geo, stride=stride)) is None


def test_f25_auto_takes_the_training_forward() -> None:
    """A training step's forward of alexnet's 5x5 layer (the batch folded into the product's columns) runs Winograd
    under 'auto': F(4,5) (3136 tiles) with R45_AUTO, else F(2,5) (12544 tiles, its V shared with the weight
    gradient)."""
    win = dataclasses.replace(Window(64, 64, 27, 27, 5, 5, 1, 1, 2, 2), fold=True)
    spec = GemmSpec(1, 192, 64 * 729, 64 * 25, (0, 0, 64 * 25, 1), (0, 0, 0, 0), 1, 0, 0, win)
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        plan = winograd_cl.pick(spec)
    assert (plan is not None) == winograd_cl.R5_AUTO
    want = (True, 5, 4, 3136) if winograd_cl.R45_AUTO else (True, 5, 2, 12544)
    assert plan is None or (plan.fold, plan.r, plan.m, plan.tiles) == want


def test_f25_weight_gradient_chunks() -> None:
    """An F(2,5) weight gradient's K chunks aim for R5_WGRAD_TILE_TARGET 64x64 tiles, F(2,3)'s for WGRAD_TILE_TARGET:
    alexnet b64's 5x5 layer (12544 tiles, 36 x 3 x 1 tiles per chunk) in 12 chunks of 1056 columns, V padded to
    12672 columns; a 3x3 128 -> 192 layer keeps the fewest chunks that make WGRAD_TILE_TARGET (11 of 16 x 3 x 2)."""
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        r5 = winograd_cl.wgrad_plan(Window(64, 64, 27, 27, 5, 5, 1, 1, 2, 2), 192)
        r3 = winograd_cl.wgrad_plan(Window(64, 128, 27, 27, 3, 3, 1, 1, 1, 1), 192)
    if winograd_cl.R5_AUTO:
        assert r5 is not None and (r5.r, r5.parts, r5.pad, r5.tp) == (5, 12, 12 * 32, 12672)
        assert 36 * 3 * r5.parts >= winograd_cl.R5_WGRAD_TILE_TARGET > 36 * 3 * (r5.parts - 1)
    assert r3 is not None and (r3.r, r3.parts) == (3, 11)
    assert 16 * 6 * r3.parts >= winograd_cl.WGRAD_TILE_TARGET > 16 * 6 * (r3.parts - 1)


def test_f25_product_tiles() -> None:
    """F(2,5)'s products take winograd_cl.product_knobs before the generic tensor-core tile rules: alexnet b64's
    training forward (192 rows, 12800 tile columns with the weight gradient's chunk padding) the ragged-row tiles,
    its input gradient (64 rows) the narrow ones; F(2,3)'s 16 products, few tile columns and other layouts do not."""
    from plait.tune import _tc_heuristic

    win = dataclasses.replace(Window(64, 64, 27, 27, 5, 5, 1, 1, 2, 2), fold=True)
    fold = GemmSpec(1, 192, 64 * 729, 64 * 25, (0, 0, 64 * 25, 1), (0, 0, 0, 0), 1, 0, 0, win)
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        fwd, dgrad = winograd_cl.pick(fold), winograd_cl.pick(_spec(64, 192, 64, 27, 27))
    assert fwd is not None and dgrad is not None
    fwd_spec = dataclasses.replace(fwd, pad=320).gemm_spec()
    assert (fwd_spec.batch, fwd_spec.m, fwd_spec.n, fwd_spec.k) == (36, 192, 12800, 64)
    assert _tc_heuristic(fwd_spec) == winograd_cl.R5_RAGGED_KNOBS
    dgrad_spec = dgrad.gemm_spec()
    assert (dgrad_spec.batch, dgrad_spec.m, dgrad_spec.n, dgrad_spec.k) == (36, 64, 12544, 192)
    assert _tc_heuristic(dgrad_spec) == winograd_cl.R5_NARROW_KNOBS
    f23 = winograd_cl.WinogradCLPlan(64, 256, 192, 28, 28, 28, 28, 1, 1, (0, 256 * 784), (0, 256 * 9, 9, 1))
    assert winograd_cl.product_knobs(f23.gemm_spec()) is None  # 16 products
    assert winograd_cl.product_knobs(_with_columns(fwd_spec, 512)) is None  # few tile columns
    assert winograd_cl.product_knobs(dataclasses.replace(fwd_spec, m=256, a=(0, 256 * 64, 64, 1))) is None
    assert winograd_cl.product_knobs(dataclasses.replace(fwd_spec, b=(0, 64 * 12800, 1, 64))) is None  # B transposed


def _with_columns(spec: GemmSpec, n: int) -> GemmSpec:
    """`spec` with `n` tile columns (B's per-product stride to match)."""
    return dataclasses.replace(spec, n=n, b=(0, spec.k * n, n, 1))


def test_f45_product_tiles() -> None:
    """F(4,5)'s 64 products (alexnet b64's forward, 192 rows, and input gradient, 64 rows, over 3136 tile columns)
    take winograd_cl.R45_KNOBS; rows that are whole 128-row tiles keep the generic rule."""
    from plait.tune import _tc_heuristic

    win = dataclasses.replace(Window(64, 64, 27, 27, 5, 5, 1, 1, 2, 2), fold=True)
    fold = GemmSpec(1, 192, 64 * 729, 64 * 25, (0, 0, 64 * 25, 1), (0, 0, 0, 0), 1, 0, 0, win)
    with settings.override(PLAIT_WINOGRAD_CL="4"):
        fwd, dgrad = winograd_cl.pick(fold), winograd_cl.pick(_spec(64, 192, 64, 27, 27))
    assert fwd is not None and dgrad is not None and fwd.m == dgrad.m == 4
    for plan, rows, depth in ((fwd, 192, 64), (dgrad, 64, 192)):
        spec = plan.gemm_spec()
        assert (spec.batch, spec.m, spec.n, spec.k) == (64, rows, 3136, depth)
        assert _tc_heuristic(spec) == winograd_cl.R45_KNOBS
    wide = dataclasses.replace(fwd.gemm_spec(), m=256, a=(0, 256 * 64, 64, 1))
    assert winograd_cl.product_knobs(wide) is None


def test_f45_weight_gradient_chunks() -> None:
    """Under 'auto' with R45_WGRAD alexnet b64's 5x5 weight gradient runs F(4,5): 3136 tiles, 64 x 3 x 1 64x64 tiles
    per chunk, in the fewest chunks of whole BK 32 steps that make R45_WGRAD_TILE_TARGET tiles, none shorter than
    R45_WGRAD_MIN_CHUNK columns (else the most such chunks); V's columns padded to whole chunks."""
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        p = winograd_cl.wgrad_plan(Window(64, 64, 27, 27, 5, 5, 1, 1, 2, 2), 192)
    if not (winograd_cl.R5_AUTO and winograd_cl.R45_WGRAD):
        assert p is None or p.m == 2
        return
    assert p is not None and (p.r, p.m, p.tiles, p.pad) == (5, 4, 3136, 32 * p.parts)
    chunk = p.tp // p.parts
    assert chunk % 32 == 0 and chunk >= winograd_cl.R45_WGRAD_MIN_CHUNK and p.tp >= p.tiles > p.tp - p.pad
    per_chunk = 64 * 3 * 1
    longer = -(-p.tiles // (32 * (p.parts + 1))) * 32 >= winograd_cl.R45_WGRAD_MIN_CHUNK
    assert per_chunk * p.parts >= winograd_cl.R45_WGRAD_TILE_TARGET or not longer
    assert p.parts == 1 or per_chunk * (p.parts - 1) < winograd_cl.R45_WGRAD_TILE_TARGET
