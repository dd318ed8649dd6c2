"""The cpu Winograd kernel's input tiles gathered by shuffles, a vector's worth (VW) of a tile row's tiles at a time
(winograd_c._gather), into rows of transformed tiles whose element stride is skewed off a multiple of 4 KB: tile rows
of several chunks and partial chunks, both tile sizes, padding 0-2, batches whose blocks span images; against
PyTorch. The chunks below are counted at VW 16; at 8 or 4 the same rows hold more and smaller partial chunks."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen import gemm, gemm_c, winograd_c
from tests.helpers import assert_close, rand

CASES = [  # n, c, h, w, k, padding
    (1, 16, 70, 70, 24, 1),  # F(4,3): 18 tiles per row (a chunk of 16 and one of 2); F(2,3): 35 (three chunks)
    (2, 8, 21, 37, 16, 0),  # rows of 9 / 18 tiles (a partial chunk), blocks across two images
    (1, 8, 12, 66, 8, 2),  # padding 2 on both sides, 17 / 34 tiles per row
]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("case", CASES)
def test_winograd_tiles_match_torch(case, m):
    n, c, h, w, k, pad = case
    x = rand((n, c, h, w), low=-1, high=1)
    wt, b = rand((k, c, 3, 3), seed=1, low=-1, high=1) * 0.2, rand((k,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp, padding=pad).relu(), device="cpu")
    with settings.override(PLAIT_WINOGRAD=str(m)):
        got = np.asarray(f(x))
        plan, _ = f.plan_for([x])
    assert any(kern.name.startswith(f"WINO{m}_") for kern in plan.kernels), [kern.name for kern in plan.kernels]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), padding=pad)
    assert_close(got, want.relu().numpy(), "float32", f"winograd F({m},3) {case}", tol_scale=10)


def test_register_tile_choice():
    """AVX-512: products over 64 input channels avoid the load-bound 24x1 register tile; deeper ones keep it where it
    pads least (winograd_c._tile_factor). Narrower vectors: the tiles priced by their micro-kernel rates, 6x2 the
    fastest, which also wins batch 1's 49-tile blocks once its partial last panel runs one vector wide."""

    def plan(c: int, k: int, hw: int) -> tuple[int, int]:
        win = F.Window(1, c, hw, hw, 3, 3, 1, 1, 1, 1, 1, 1)
        p = winograd_c.pick(gemm.GemmSpec(1, k, hw * hw, c * 9, (0, 0, c * 9, 1), (0, 0, 0, 0), conv=win))
        assert p is not None
        return p.mr, p.nv

    if gemm_c.VW != 16:
        assert winograd_c._padded(49, 2) == 48 + gemm_c.VW * winograd_c.TAIL_COST  # the 49th tile: one-vector kernel
        assert winograd_c._padded(49, 1) == -(-49 // gemm_c.VW) * gemm_c.VW
        for c, hw in ((64, 56), (64, 224), (128, 112), (128, 28), (256, 14), (192, 13)):
            assert plan(c, c, hw) == (6, 2), (c, hw)
        return
    assert plan(64, 64, 56) != (24, 1)
    assert plan(64, 64, 224) != (24, 1)
    assert plan(128, 128, 112) == (24, 1)
    # batch 1's deep 14x14 and 13x13 layers (49 tiles in all): the 12x2 tile (SMALL_BLOCK_COST), not 6x4 or 24x1
    assert plan(256, 256, 14) == (12, 2)
    assert plan(192, 384, 13) == (12, 2)


def _conv_relu_matches_torch(c: int, hw: int, kind: str, what: str) -> None:
    """A batch-1 c -> c channel 3x3 convolution on an hw x hw plane with bias and ReLU runs as a `kind` Winograd
    kernel and matches PyTorch."""
    x = rand((1, c, hw, hw), low=-1, high=1)
    wt, b = rand((c, c, 3, 3), seed=1, low=-1, high=1) * 0.05, rand((c,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp, padding=1).relu(), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    assert any(kern.name.startswith(kind) for kern in plan.kernels), [kern.name for kern in plan.kernels]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), padding=1)
    assert_close(got, want.relu().numpy(), "float32", what, tol_scale=10)


def test_small_deep_layer_matches_torch():
    """resnet18 b1's 256-channel 14x14 layer in F(2,3) (PLAIT_WINOGRAD=2; at VW 16 the 12x2 register tile, 43 -> 22
    row groups of which the last holds 4 of 12 rows; narrower, 6x2 with the 49th tile on the one-vector kernel) and
    as the per-layer choice runs it (F(4,3) on 16 tiles with narrower vectors), with its bias and ReLU, against
    PyTorch."""
    with settings.override(PLAIT_WINOGRAD="2"):
        _conv_relu_matches_torch(256, 14, "WINO2_", "resnet18 layer3 b1, F(2,3)")
    choice = "WINO2_" if gemm_c.VW == 16 else "WINO4_"
    _conv_relu_matches_torch(256, 14, choice, "resnet18 layer3 b1, the per-layer choice")


def test_product_tasks_split_evenly_over_two_threads():
    """resnet b1's 128-channel 28x28 F(4,3) layer (one block of 49 tiles): the register tile is priced by how its
    product tasks (blocks x row groups) split over winograd_c.TEAM_SPLIT threads, so it takes 6x4 (22 row groups,
    11:11) rather than 12x2 (11, 6:5); the plan's output matches PyTorch."""
    win = F.Window(1, 128, 28, 28, 3, 3, 1, 1, 1, 1, 1, 1)
    p = winograd_c.pick(gemm.GemmSpec(1, 128, 784, 1152, (0, 0, 1152, 1), (0, 0, 0, 0), conv=win))
    assert p is not None and p.m == 4
    tasks = -(-p.n * -(-p.oh // p.m) // p.rpb) * (p.kp // p.mr)
    assert tasks % winograd_c.TEAM_SPLIT == 0, (p.mr, p.nv, p.rpb, tasks)
    _conv_relu_matches_torch(128, 28, "WINO4_", "resnet layer2 b1")
