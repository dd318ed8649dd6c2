"""The `cpu` device's 1x1 convolutions across the vector lanes (PWLANES, plait/codegen/pointwise_c.py): one image's
product over a 7x7 to 14x14-sized plane with constant weights, packed once when the plan is built. Against PyTorch:
partial panels of channels and partial pixel tiles, k in two blocks, each register tile, a fused batch-norm-style
epilogue with ReLU6 and a residual add; and the rule that keeps the GEMM (weights passed per call, batch 2, more
than LANES_MAX_K input channels)."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import pointwise_c
from plait.runtime import get_device
from plait.runtime.base import join_sources
from plait.schedule.plan import render
from tests.helpers import assert_close, rand


@pytest.fixture(autouse=True)
def _lanes_at_any_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lanes kernel runs in plans only with 16-float vectors (pointwise_c.LANES); here it is tested at the host's
    width whatever that is."""
    monkeypatch.setattr(pointwise_c, "LANES", True)


CASES = [  # input channels, output channels, plane side
    (64, 96, 14),  # mobilenet_v2's 14x14 expand: two panels of 48, 196 pixels (28 tiles of 7)
    (160, 960, 7),  # mobilenet_v2's 7x7 expand: 20 panels, 49 pixels
    (17, 33, 12),  # a partial panel of 33 channels, odd k
    (512, 40, 13),  # k in two blocks of 256, 169 pixels (a partial tile)
    (96, 16, 16),  # one vector of channels, 256 pixels
    (24, 100, 20),  # 400 pixels
]


def _kinds(f: plait.jit, x: np.ndarray) -> list[str]:
    plan, _ = f.plan_for([x])
    return [k.name.split("_")[0] for k in plan.kernels]


@pytest.mark.parametrize(("ci", "co", "hw"), CASES)
def test_lanes_matches_torch(ci: int, co: int, hw: int) -> None:
    x, w = rand((1, ci, hw, hw)), rand((co, ci, 1, 1), seed=1) / np.float32(ci**0.5)
    scale, shift = rand((co,), seed=2), rand((co,), seed=3)
    wt, st, ht = (plait.tensor(a, device="cpu") for a in (w, scale, shift))
    f = plait.jit(lambda t: (F.conv2d(t, wt) * st.reshape(co, 1, 1) + ht.reshape(co, 1, 1)).clip(0.0, 6.0), "cpu")
    assert _kinds(f, x) == ["PWLANES"]
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w))
    ref = (ref * torch.tensor(scale).reshape(co, 1, 1) + torch.tensor(shift).reshape(co, 1, 1)).clamp(0.0, 6.0)
    for _ in range(2):  # a replay reads the weights packed when the plan was built
        assert_close(f(x), ref.numpy(), "float32", f"1x1 across the lanes {ci}->{co} {hw}x{hw}", tol_scale=10)


@pytest.mark.parametrize("tile", sorted(pointwise_c.LANES_TILES))
def test_each_tile(tile: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each register tile on a product with partial panels and tiles, with a residual add fused."""
    monkeypatch.setattr(pointwise_c, "LANES_TILES", {tile: 1.0})
    x, w, res = rand((1, 40, 13, 13)), rand((50, 40, 1, 1), seed=1), rand((1, 50, 13, 13), seed=2)
    wt, rt = plait.tensor(w, device="cpu"), plait.tensor(res, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wt) + rt, "cpu")
    assert _kinds(f, x) == ["PWLANES"]
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w)) + torch.tensor(res)
    assert_close(f(x), ref.numpy(), "float32", f"tile {tile}", tol_scale=10)


@pytest.mark.parametrize(("n", "ci", "co", "hw"), [(2, 64, 96, 14), (1, 960, 160, 7), (1, 1024, 256, 14)])
def test_gemm_keeps_other_products(n: int, ci: int, co: int, hw: int) -> None:
    """Batches above one and products over more than LANES_MAX_K input channels stay with the GEMM."""
    x, w = rand((n, ci, hw, hw)), rand((co, ci, 1, 1), seed=1)
    wt = plait.tensor(w, device="cpu")
    assert _kinds(plait.jit(lambda t: F.conv2d(t, wt), "cpu"), x) == ["GEMM"]


def test_weights_passed_per_call_keep_the_gemm() -> None:
    """A weight that is an argument of the plan changes between calls: it is never packed once."""
    x = rand((1, 64, 14, 14))
    f = plait.jit(lambda t, w: F.conv2d(t, w), "cpu")
    for seed in (1, 2):
        w = rand((96, 64, 1, 1), seed=seed)
        plan, _ = f.plan_for([x, w])
        assert [k.name.split("_")[0] for k in plan.kernels] == ["GEMM"]
        ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w)).numpy()
        assert_close(f(x, w), ref, "float32", f"weights per call, seed {seed}", tol_scale=10)


def test_tiles_build_as_one_translation_unit() -> None:
    """Products with different register tiles and their weight packings join into one library (a plan's kernels
    build a few to a compiler run; a clash would rebuild every kernel alone)."""
    x = rand((1, 40, 14, 14))
    # 64 and 20 output channels take different tiles at each vector width (20: a narrower panel pads less)
    w1, w2 = rand((64, 40, 1, 1), seed=1), rand((20, 64, 1, 1), seed=2)
    t1, t2 = plait.tensor(w1, device="cpu"), plait.tensor(w2, device="cpu")
    f = plait.jit(lambda t: F.conv2d(F.conv2d(t, t1).relu(), t2), "cpu")
    plan, _ = f.plan_for([x])
    assert [k.name.split("_")[0] for k in plan.kernels] == ["PWLANES", "PWLANES"]
    assert len({k.source.split("plait_pwlanes_")[1][:3] for k in plan.kernels}) == 2  # two register tiles
    packs = [(r.source, r.name) for r in (render(plan.device, it) for it in plan.items) if r.name.startswith("PWPACK")]
    get_device("cpu")._build(join_sources([(k.source, k.name) for k in plan.kernels] + packs))
    ref = torch.nn.functional.conv2d(
        torch.relu(torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w1))), torch.tensor(w2)
    )
    assert_close(f(x), ref.numpy(), "float32", "two products across the lanes", tol_scale=10)
