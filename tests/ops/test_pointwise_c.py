"""The `cpu` device's streaming pointwise product (plait_pointwise: few rows over long row-contiguous B, B read in
place): 1x1 convolutions with few output channels and fused epilogues (bias, ReLU6, a residual add), partial
column blocks and row blocks, one image and several, and a batched product whose entries have their own A, against
PyTorch."""

import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import pointwise_c
from tests.helpers import assert_close, rand

CONVS = [  # batch, in channels, out channels, height, width
    (
        1,
        32,
        16,
        24,
        24,
    ),  # 576 columns: nine 48-column blocks (8x3 tile at 16-float vectors), one run of prefetched blocks and a part
    (2, 96, 24, 23, 23),  # 529 columns: a partial last block, two images
    (1, 192, 32, 28, 28),  # two row blocks of 11 (32 rows: 11 + 11 + 10, the last one partial)
    (3, 40, 20, 16, 40),  # 20 rows in blocks of 7, 640 columns
]


@pytest.mark.parametrize("geo", CONVS)
def test_pointwise_conv_matches_torch(geo):
    n, ci, co, h, w = geo
    x, wt, b = rand((n, ci, h, w)), rand((co, ci, 1, 1), seed=1, low=-0.3, high=0.3), rand((co,), seed=2)
    res = rand((n, co, h, w), seed=3)

    def fn(t: plait.Tensor, r: plait.Tensor) -> plait.Tensor:
        y = F.conv2d(t, plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu"))
        return y.clip(0.0, 6.0) + r

    jit = plait.jit(fn, device="cpu")
    plan, _ = jit.plan_for([x, res])
    assert [k.name.split("_")[0] for k in plan.kernels] == ["GEMM"], [k.name for k in plan.kernels]
    assert "plait_pointwise_" in plan.kernels[0].source
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(wt), torch.tensor(b)).clamp(0.0, 6.0)
    assert_close(jit(x, res), (ref + torch.tensor(res)).numpy(), "float32", f"pointwise {geo}", tol_scale=10)


def test_pointwise_batched_own_weights():
    """A batched product whose entries each have their own A (packed per task, not once per call)."""
    a, bm = rand((3, 12, 50), seed=4), rand((3, 50, 700), seed=5)
    jit = plait.jit(lambda p, q: p @ q, device="cpu")
    plan, _ = jit.plan_for([a, bm])
    assert "plait_pointwise_" in plan.kernels[0].source
    assert_close(jit(a, bm), (torch.tensor(a) @ torch.tensor(bm)).numpy(), "float32", "batched pointwise", 10)


# (rows, k, tile): at 16-float vectors; at 8 or 4 (TILES 6x2 and 12x1) k is given in B blocks of L1 of one vector
# per row (k_l1): 6x2's block passes it, 12x1's just fits, and at twice that neither does
_K_L1 = pointwise_c.L1_BLOCK // (4 * pointwise_c.VW)
PICKS = (
    [(16, 32, (8, 3)), (24, 96, (6, 4)), (32, 192, (11, 2)), (5, 2048, (5, 1))]
    if pointwise_c.VW == 16
    else [(16, 32, (6, 2)), (20, 64, (5, 2)), (32, _K_L1, (11, 1)), (5, 2 * _K_L1, (5, 1))]
)


@pytest.mark.parametrize(("m", "k", "tile"), PICKS)
def test_pick_tile(m, k, tile):
    """Rows split into equal blocks of the tile that pads least among those whose B block stays in L1."""
    assert pointwise_c.pick_tile(m, k) == tile
