"""Weight gradients of 3x3 stride-1 training convolutions by Winograd F(2,3) on OpenCL (`winograd_cl.wgrad_plan`,
`winograd_cl_wgrad`): dW = G^T [sum over tiles of (A dy A^T) . (B^T x B)] G against PyTorch in float64 (tile edges,
padding 0, 1 and 2, K chunks), the per-layer choice of PLAIT_WINOGRAD_CL, and the training step's graph taking it.

Tolerance as in test_winograd_cl.py: within TOL times the largest magnitude of the float64 reference (the direct
product meets about 3e-7 of it on the same data; the transforms add a few inputs before the products)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait import dtypes, settings
from plait.codegen import gemm, winograd_cl
from plait.errors import PlaitError, ShapeError
from plait.graph import autodiff
from plait.graph.node import Node, toposort
from plait.graph.ops.conv import Window
from plait.graph.ops.winograd_cl import winograd_cl_wgrad
from plait.schedule.plan import Plan
from tests.conftest import DEVICES

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
TOL = 1e-5


def _weight_gradient(device: str, n: int, c: int, k: int, h: int, w: int, padding: int, mode: str):
    """(plait's weight gradient of sum(conv2d(x, w) * g) under PLAIT_WINOGRAD_CL=`mode`, PyTorch's in float64, the
    gradient node) on random data."""
    rng = np.random.default_rng(0)
    xa = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wa = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    ga = rng.standard_normal((n, k, h + 2 * padding - 2, w + 2 * padding - 2)).astype(np.float32)
    x = plait.tensor(xa, device=device, requires_grad=True)
    wt = plait.tensor(wa, device=device, requires_grad=True)
    with settings.override(PLAIT_WINOGRAD_CL=mode):
        loss = (F.conv2d(x, wt, padding=padding) * plait.tensor(ga, device=device)).sum()
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
        node = autodiff.gradients(loss.node, seed, [wt.node])[wt.node.uid]
    wr = torch.tensor(wa, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.conv2d(torch.tensor(xa, dtype=torch.float64), wr, padding=padding)
    (ref * torch.tensor(ga, dtype=torch.float64)).sum().backward()
    assert wr.grad is not None
    return node, wr.grad.numpy()


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize(
    "geometry",
    [
        (2, 8, 16, 6, 6, 1),  # whole tiles
        (3, 5, 17, 7, 9, 1),  # odd output sizes: tiles cut by both edges, channels off the vector width
        (1, 4, 20, 5, 5, 0),  # no padding
        (2, 3, 16, 6, 5, 2),  # padding 2: the output is larger than the input
    ],
)
def test_winograd_weight_gradient_matches_torch(device: str, geometry: tuple[int, ...]) -> None:
    *shape, padding = geometry
    node, want = _weight_gradient(device, *shape, padding, "2")
    assert any(x.op == "winograd_cl_wgrad" for x in toposort([node]))
    (got,) = Plan([node])()
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= TOL * scale, f"{geometry}: max error {err:.3g} > {TOL} x {scale:.3g}"


@pytest.mark.parametrize("device", CL_DEVICES)
def test_winograd_weight_gradient_in_k_chunks(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three K chunks of 32 tile columns (the last one partly padding): the output kernel sums them in order."""
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        plan = winograd_cl.wgrad_plan(Window(3, 6, 10, 10, 3, 3, 1, 1, 1, 1), 16)
    assert plan is not None and plan.parts == 1
    chunked = dataclasses.replace(plan, pad=96, parts=3)
    monkeypatch.setattr(F, "wgrad_plan", lambda win, k: chunked)
    node, want = _weight_gradient(device, 3, 6, 16, 10, 10, 1, "2")
    (got,) = Plan([node])()
    assert chunked.tiles == 75 and chunked.tp == 96
    scale = float(np.abs(want).max())
    assert float(np.abs(got.astype(np.float64) - want).max()) <= TOL * scale


def test_auto_picks_wide_layers_in_chunks_of_whole_k_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """'auto' keeps layers with 64 output channels (or under 64 input ones) on the direct product and splits the
    others' tile columns into chunks of at least WGRAD_MIN_CHUNK (whole 32-column steps): with channels in whole
    128s the fewest that make WGRAD_WIDE_TARGET 128x128 tiles in chunks of WGRAD_WIDE_MIN_CHUNK or more, else (or
    where no such chunks make them) those that make WGRAD_TILE_TARGET 64x64 tiles. (F(2,3)'s rule: R43_WGRAD off.)"""
    monkeypatch.setattr(winograd_cl, "R43_WGRAD", False)
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        assert winograd_cl.wgrad_plan(Window(64, 64, 56, 56, 3, 3, 1, 1, 1, 1), 64) is None
        assert winograd_cl.wgrad_plan(Window(64, 32, 112, 112, 3, 3, 1, 1, 1, 1), 128) is None
        assert winograd_cl.wgrad_plan(Window(64, 64, 112, 112, 3, 3, 1, 1, 1, 1), 128) is not None  # vgg16 conv2_1
        assert winograd_cl.wgrad_plan(Window(64, 256, 28, 28, 3, 3, 2, 2, 1, 1), 256) is None  # stride 2
        assert winograd_cl.wgrad_plan(Window(1, 256, 28, 28, 3, 3, 1, 1, 1, 1), 256) is None  # 196 tiles
        # under 128 input channels WGRAD_MIN_TILES_NARROW tiles (cifar_cnn's 64 -> 128 at 8x8 has 1024), else MIN_TILES
        assert winograd_cl.wgrad_plan(Window(64, 64, 8, 8, 3, 3, 1, 1, 1, 1), 128) is None
        assert winograd_cl.wgrad_plan(Window(64, 64, 16, 16, 3, 3, 1, 1, 1, 1), 128) is not None  # 4096 tiles
        assert winograd_cl.wgrad_plan(Window(64, 128, 8, 8, 3, 3, 1, 1, 1, 1), 128) is not None  # 1024 tiles
        p = winograd_cl.wgrad_plan(Window(64, 256, 56, 56, 3, 3, 1, 1, 1, 1), 256)
    assert p is not None and p.tiles == 64 * 28 * 28
    chunk = p.tp // p.parts
    assert p.tp % p.parts == 0 and chunk % winograd_cl.WGRAD_CHUNK_UNIT == 0 and chunk >= winograd_cl.WGRAD_MIN_CHUNK
    assert 16 * p.parts * 4 >= winograd_cl.WGRAD_WIDE_TARGET > 16 * (p.parts - 1) * 4  # 4 tiles of 128x128
    with settings.override(PLAIT_WINOGRAD_CL="auto"):
        narrow = winograd_cl.wgrad_plan(Window(64, 64, 112, 112, 3, 3, 1, 1, 1, 1), 128)  # 64 input channels
        short = winograd_cl.wgrad_plan(Window(64, 128, 28, 28, 3, 3, 1, 1, 1, 1), 128)  # 12 chunks: 192 wide tiles
        small = winograd_cl.wgrad_plan(Window(64, 512, 7, 7, 3, 3, 1, 1, 1, 1), 512)  # one chunk of 1024 columns
    assert narrow is not None and 16 * narrow.parts * 2 >= winograd_cl.WGRAD_TILE_TARGET > 16 * (narrow.parts - 1) * 2
    assert short is not None and short.parts == 12 and short.tp // short.parts >= winograd_cl.WGRAD_MIN_CHUNK
    assert small is not None and small.parts == 1 and small.tp < winograd_cl.WGRAD_WIDE_MIN_CHUNK
    with settings.override(PLAIT_WINOGRAD_CL="off"):
        assert winograd_cl.wgrad_plan(Window(64, 256, 56, 56, 3, 3, 1, 1, 1, 1), 256) is None
    with settings.override(PLAIT_WINOGRAD_CL="fast"), pytest.raises(PlaitError, match="PLAIT_WINOGRAD_CL"):
        winograd_cl.wgrad_plan(Window(64, 256, 56, 56, 3, 3, 1, 1, 1, 1), 256)


def test_mismatched_shapes_raise() -> None:
    """An output gradient whose shape is not the plan's names the op and both shapes."""
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        plan = winograd_cl.wgrad_plan(Window(2, 8, 6, 6, 3, 3, 1, 1, 1, 1), 16)
    assert plan is not None
    dy = Node("input", (), None, (2, 16, 5, 6), dtypes.float32, "cpu")
    x = Node("input", (), None, (2, 8, 6, 6), dtypes.float32, "cpu")
    with pytest.raises(ShapeError, match=r"winograd_cl_wgrad: output gradient \(2, 16, 5, 6\)"):
        winograd_cl_wgrad(dy, x, plan)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_training_forward_shares_the_weight_gradients_input_tiles(device: str) -> None:
    """In one plan with the forward, the forward's Winograd takes the weight gradient's V (one input transform of
    x, made before the forward and padded as the gradient's chunks need) and both results stay right."""
    rng = np.random.default_rng(1)
    xa = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    wa = (rng.standard_normal((16, 8, 3, 3)) / np.sqrt(72)).astype(np.float32)
    ga = rng.standard_normal((2, 16, 6, 6)).astype(np.float32)
    x = plait.tensor(xa, device=device, requires_grad=True)
    wt = plait.tensor(wa, device=device, requires_grad=True)
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        out = F.conv2d(x, wt, padding=1)
        loss = (out * plait.tensor(ga, device=device)).sum()
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
        node = autodiff.gradients(loss.node, seed, [wt.node])[wt.node.uid]
        plan = Plan([out.node, node])
    ops = [it.out.op for it in plan.items]
    assert ops.count("winograd_cl_input") == 1 and ops.index("winograd_cl_input") < ops.index("winograd_cl_dy")
    got_out, got_w = plan()
    wr = torch.tensor(wa, dtype=torch.float64, requires_grad=True)
    ref = torch.nn.functional.conv2d(torch.tensor(xa, dtype=torch.float64), wr, padding=1)
    (ref * torch.tensor(ga, dtype=torch.float64)).sum().backward()
    assert wr.grad is not None
    for got, want in ((got_out, ref.detach().numpy()), (got_w, wr.grad.numpy())):
        assert float(np.abs(got - want).max()) <= TOL * float(np.abs(want).max())


@pytest.mark.parametrize("device", CL_DEVICES)
def test_wide_products_take_the_winograd_tile_rule(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight gradient whose 16 products make WGRAD_WIDE_TARGET 128x128 tiles (512 channels in and out; the
    shortest chunk lowered to this tiny image's 32 columns): the scheduled GEMM is recognised by `wgrad_knobs`,
    which the tensor-core heuristic returns, and the gradient stays right. The forward's Winograd product and a
    direct weight gradient keep the generic rule."""
    from plait.tune import _tc_heuristic

    monkeypatch.setattr(winograd_cl, "WGRAD_WIDE_MIN_CHUNK", 32)
    node, want = _weight_gradient(device, 1, 512, 512, 4, 4, 1, "2")
    plan = Plan([node])
    (spec,) = [it.gemm for it in plan.items if it.kind == "gemm"]
    assert spec is not None and (spec.batch, spec.m, spec.n) == (16, 512, 512)
    assert winograd_cl.wgrad_knobs(spec) == winograd_cl.WGRAD_WIDE_KNOBS == _tc_heuristic(spec)
    (got,) = plan()
    assert float(np.abs(got.astype(np.float64) - want).max()) <= TOL * float(np.abs(want).max())
    direct, _ = _weight_gradient(device, 1, 512, 512, 4, 4, 1, "off")
    with settings.override(PLAIT_WINOGRAD_CL="2"):
        forward = winograd_cl.WinogradCLPlan(64, 512, 512, 28, 28, 28, 28, 1, 1, (0, 512 * 784), (0, 4608, 1))
    others = [it.gemm for it in Plan([direct]).items if it.kind == "gemm"] + [forward.gemm_spec()]
    assert others and all(s is not None and winograd_cl.wgrad_knobs(s) is None for s in others)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_narrow_products_take_the_winograd_tile_rule(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight gradient with 64 input channels and 128 output ones: its scheduled product (16 x 128 x 64; the tile
    target lowered to its 32 64x64 tiles) takes WGRAD_NARROW_KNOBS (64x64 tiles, K split over two warps) from the
    tensor-core heuristic, and the gradient stays right; 32 input channels, 64 output ones or fewer tiles than the
    target are other products."""
    from plait.tune import _tc_heuristic

    monkeypatch.setattr(winograd_cl, "WGRAD_TILE_TARGET", 32)
    node, want = _weight_gradient(device, 1, 64, 128, 4, 4, 1, "2")
    plan = Plan([node])
    (spec,) = [it.gemm for it in plan.items if it.kind == "gemm"]
    assert spec is not None and (spec.batch, spec.m, spec.n) == (16, 128, 64)
    assert winograd_cl.wgrad_knobs(spec) == winograd_cl.WGRAD_NARROW_KNOBS == _tc_heuristic(spec)
    (got,) = plan()
    assert float(np.abs(got.astype(np.float64) - want).max()) <= TOL * float(np.abs(want).max())
    assert winograd_cl.wgrad_knobs(dataclasses.replace(spec, n=32, b=(0, 32 * spec.k, 1, spec.k))) is None
    assert winograd_cl.wgrad_knobs(dataclasses.replace(spec, m=64, a=(0, 64 * spec.k, spec.k, 1))) is None
    monkeypatch.setattr(winograd_cl, "WGRAD_TILE_TARGET", 33)
    assert winograd_cl.wgrad_knobs(spec) is None


def test_wide_rule_checks_the_product_layout() -> None:
    """`wgrad_knobs` takes only the chunked layout `winograd_cl_wgrad` gives its matmul (here 2 chunks of 3136
    tile columns, both operands (16, rows, 6272)) with WGRAD_WIDE_TARGET 128x128 tiles; a shifted chunk, rows off
    whole 128s, too few tiles or chunks under WGRAD_WIDE_MIN_CHUNK are other products."""
    a, b = (0, 512 * 6272, 6272, 1), (0, 512 * 6272, 1, 6272)
    spec = gemm.GemmSpec(32, 512, 512, 3136, a, b, 2, 3136, 3136)
    assert winograd_cl.wgrad_knobs(spec) == winograd_cl.WGRAD_WIDE_KNOBS  # 32 x 4 x 4 tiles
    assert winograd_cl.wgrad_knobs(dataclasses.replace(spec, a_inner=3168)) is None
    assert winograd_cl.wgrad_knobs(dataclasses.replace(spec, m=448)) is None
    assert winograd_cl.wgrad_knobs(dataclasses.replace(spec, m=256, n=256, a=(0, 256 * 6272, 6272, 1))) is None
    a, b = (0, 512 * 2048, 2048, 1), (0, 512 * 2048, 1, 2048)
    assert winograd_cl.wgrad_knobs(gemm.GemmSpec(32, 512, 512, 1024, a, b, 2, 1024, 1024)) is None
