"""The `cpu` device's GEMM with a constant weight packed at plan build in the register tile's order (gemm_c.APack,
scheduler._packed_gemm): 1x1 and strided implicit-GEMM convolutions against PyTorch with every register tile, a
partial last row block, fringe columns (1 to 4 past the last whole panel), k in several blocks, the k-split driver
and a batch sharing the weight, at 1, 2 and 3 threads; and a weight computed per call, which the product keeps reading where it lies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c, pointwise_c
from tests.helpers import assert_close, rand

CASES = [  # batch, input channels, output channels, plane side, stride, window
    (1, 512, 100, 7, 1, 1),  # 49 columns: 48 + a fringe of 1; 100 rows: a partial last row block
    (1, 200, 64, 14, 1, 1),  # 196 = 192 + 4 fringe columns
    (1, 300, 37, 12, 1, 1),  # 144 columns, k over several blocks, 37 rows
    (2, 64, 50, 9, 1, 1),  # a batch of two narrow images sharing the packed weight (their columns merged)
    (3, 48, 40, 20, 1, 1),  # a batch of three wide images, each its own product
    (1, 96, 130, 14, 2, 1),  # a strided 1x1 (the downsample's implicit GEMM), 49 columns
    (1, 64, 70, 15, 2, 3),  # a strided 3x3 over 576 patch rows, 64 columns
    (1, 512, 64, 13, 2, 3),  # a strided 3x3 over 4608 patch rows, 49 columns: the k-split driver at 2+ threads
    # A over gemm_c.SHRINK_A_FLOATS with few column panels: the threads split rows (sharing one packing of B) rather
    # than each stream all of A for narrower column chunks
    (1, 256, 600, 14, 1, 1),  # 196 columns, 600 rows
    (2, 512, 300, 7, 1, 1),  # two images' 49 columns merged, 300 rows
]


@pytest.fixture(autouse=True)
def _gemm_not_lanes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 16-float vectors the narrow 1x1 products would run across the lanes (pointwise_c.LANES); here the GEMM
    takes them at any width."""
    monkeypatch.setattr(pointwise_c, "LANES", False)


def _packed(f: plait.jit, x: np.ndarray) -> list[bool]:
    plan, _ = f.plan_for([x])
    return ["apack" in it.extra for it in plan.items if it.kind == "gemm"]


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int) -> np.ndarray:
    out = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w), torch.tensor(b), stride, pad)
    return out.relu().numpy()


@pytest.mark.parametrize(("n", "ci", "co", "hw", "stride", "ks"), CASES)
def test_packed_weight_matches_torch(n: int, ci: int, co: int, hw: int, stride: int, ks: int, team_size: int) -> None:
    x = rand((n, ci, hw, hw))
    w, b = rand((co, ci, ks, ks), seed=1) / np.float32((ci * ks * ks) ** 0.5), rand((co,), seed=2)
    wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wt, bt, stride, ks // 2).relu(), "cpu")
    assert _packed(f, x) == [True]
    want = _conv(x, w, b, stride, ks // 2)
    for _ in range(2):  # a replay reads the weights packed when the plan was built
        assert_close(f(x), want, "float32", f"packed {n}x{ci}->{co} {hw}x{hw} s{stride} k{ks}", tol_scale=10)


@pytest.mark.parametrize("tile", gemm_c.TILES)
def test_each_tile_packed(tile: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every register tile reads its own packing: 50 rows (a partial block for each tile height) over 49 and 196
    columns (fringes of 1 and 4)."""
    monkeypatch.setattr(gemm_c, "TILES", (tile,))
    for hw in (7, 14):
        x = rand((1, 70, hw, hw))
        w, b = rand((50, 70, 1, 1), seed=1) / np.float32(70**0.5), rand((50,), seed=2)
        wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
        f = plait.jit(lambda t, wt=wt, bt=bt: F.conv2d(t, wt, bt).relu(), "cpu")
        assert _packed(f, x) == [True]
        plan, _ = f.plan_for([x])
        assert f"plait_sgemm_{tile[0]}x{tile[1]}(" in plan.kernels[0].source
        assert_close(f(x), _conv(x, w, b, 1, 0), "float32", f"tile {tile} {hw}x{hw}", tol_scale=10)


def test_weights_computed_per_call_are_read_in_place() -> None:
    """A weight that is an input of the plan is not a constant: the product reads it where it lies, and a new
    weight gives a new result."""
    x, w = rand((1, 64, 7, 7)), rand((96, 64, 1, 1), seed=1)
    f = plait.jit(lambda t, u: F.conv2d(t, u).relu(), "cpu")
    plan, _ = f.plan_for([x, w])
    assert not any("apack" in it.extra for it in plan.items)
    for s in (1.0, -0.5):
        got = f(x, w * np.float32(s))
        want = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w * np.float32(s))).relu().numpy()
        assert_close(got, want, "float32", f"weight as input x{s}", tol_scale=10)


def test_apack_off_reads_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm_c, "APACK", False)
    x, w = rand((1, 64, 7, 7)), rand((96, 64, 1, 1), seed=1)
    wt = plait.tensor(w, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wt), "cpu")
    assert _packed(f, x) == [False]
    assert_close(f(x), torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(w)).numpy(), "float32", "in place")
