"""The register tile of a product across the vector lanes (pointwise_c.lanes_plan) is priced by how plait_pwlanes
deals its (panel, pixel tile) work out to LANES_SPLIT threads: resnet50 b1's 2048 x 49 products take a tile whose
panels the two threads share evenly, and the kernel with that tile matches PyTorch at any team size."""

import re

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import pointwise_c
from tests.helpers import assert_close, rand


@pytest.fixture(autouse=True)
def _lanes_at_any_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lanes kernel runs in plans only with 16-float vectors (pointwise_c.LANES); here it is tested at the host's
    width whatever that is."""
    monkeypatch.setattr(pointwise_c, "LANES", True)


def _shares(panels: int, tiles: int, threads: int) -> list[int]:
    """Each thread's (panel, tile) pairs under plait_pwlanes' split, worked out pair by pair."""
    want = 4 * threads
    chunks = min(want, panels)
    per = min(-(-want // chunks), tiles)
    tasks = chunks * per
    base, extra = divmod(tasks, threads)
    bounds = [0]
    for th in range(threads):
        bounds.append(bounds[-1] + base + (th < extra))
    owner = [next(th for th in range(threads) if bounds[th] <= t < bounds[th + 1]) for t in range(tasks)]
    out = [0] * threads
    for p in range(panels):
        for q in range(tiles):
            c = next(c for c in range(chunks) if panels * c // chunks <= p < panels * (c + 1) // chunks)
            r = next(r for r in range(per) if tiles * r // per <= q < tiles * (r + 1) // per)
            out[owner[c * per + r]] += 1
    return out


def test_split_loss_counts_the_drivers_shares() -> None:
    for panels, tiles in [(43, 7), (32, 7), (1, 28), (3, 7), (5, 13), (27, 7)]:
        shares = _shares(panels, tiles, pointwise_c.LANES_SPLIT)
        want = max(shares) * pointwise_c.LANES_SPLIT / (panels * tiles)
        assert abs(pointwise_c._lanes_split_loss(panels, tiles) - want) < 1e-12, (panels, tiles, shares)


def test_2048x49_product_splits_evenly_and_matches_torch() -> None:
    x = rand((1, 512, 7, 7), low=-1, high=1)
    w, b = rand((2048, 512, 1, 1), seed=1, low=-1, high=1) * 0.05, rand((2048,), seed=2)
    wp, bp = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp).relu(), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    lanes = [k for k in plan.kernels if k.name.startswith("PWLANES_")]
    assert lanes, [k.name for k in plan.kernels]
    tile = re.search(r"plait_pwlanes_(\d+)x(\d+)", lanes[0].source)
    assert tile is not None
    assert -(-2048 // (int(tile[2]) * pointwise_c.VW)) % pointwise_c.LANES_SPLIT == 0, tile[0]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)).relu()
    assert_close(got, want.numpy(), "float32", "2048x49x512 across the lanes", tol_scale=10)
