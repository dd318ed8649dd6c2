"""An image stem in the lanes form and the max pool that alone reads it, fused into one cpu kernel
(plait/codegen/stem_pool_c.py: the pool runs on the stem's channel-vector row tiles, only pooled rows are stored).
Checked against PyTorch on alexnet's and resnet's stems (small planes), pool windows with padding that clip at the
plane's edges, ceil mode, odd sizes, dilation, batch 2, a folded batch norm's negative scales before the ReLU, weights
as plan inputs, and the cases that keep two kernels (the stem's output also read elsewhere, a per-pixel epilogue)."""

import time

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import stem_pool_c
from tests.helpers import assert_close, rand

CASES = [  # n, h, w, conv kernel, stride, padding, pool kernel, stride, padding, dilation, ceil mode
    (1, 43, 47, 11, 4, 2, 3, 2, 0, 1, False),  # alexnet's stem and pool, small: 11 x 10 conv rows
    (2, 45, 37, 7, 2, 3, 3, 2, 1, 1, False),  # resnet's stem and pool over odd sizes, two images
    (1, 61, 59, 7, 2, 3, 3, 2, 1, 1, True),  # ceil mode: the last window hangs past the plane's edge
    (1, 50, 40, 5, 2, 2, 2, 2, 0, 1, False),  # 2x2/2 pool, no overlap between bands
    (1, 40, 44, 7, 2, 3, 3, 1, 1, 2, False),  # stride-1 pool with dilation 2: bands share four conv rows
    (1, 15, 29, 7, 2, 3, 3, 2, 1, 1, False),  # 4 pooled rows: bands of 2 (band_rows)
    (1, 35, 21, 7, 2, 3, 3, 2, 1, 1, False),  # 9 pooled rows: bands of 1
]


def _fused(f, *arrays) -> bool:
    plan, _ = f.plan_for(list(arrays))
    return any("plait_conv_dlpool_" in kern.source for kern in plan.kernels)


def _packed_at_build(f, *arrays) -> bool:
    """Whether the plan packs the stem's weights in an item of their own (run once, at plan build)."""
    plan, _ = f.plan_for(list(arrays))
    return any(it.out.op == "pointwise_weight" and it.extra.get("constant") for it in plan.items)


def test_band_rows_balance_two_threads():
    """Bands of pooled rows leave two threads (contiguous halves of the tasks) the fewest rows on the busier one:
    alexnet b1's 27 pooled rows in bands of 2 (14 and 13 rows, not 16 and 11), resnet's 56 in bands of 4."""
    assert stem_pool_c.band_rows(1, 27) == 2
    assert stem_pool_c.band_rows(1, 56) == 4
    assert stem_pool_c.band_rows(16, 27) == 4
    assert (stem_pool_c.band_rows(1, 4), stem_pool_c.band_rows(1, 9)) == (2, 1)


@pytest.mark.parametrize("case", CASES)
def test_stem_pool_matches_torch(case):
    n, h, w, k, s, p, pk, ps, pp, pd, ceil = case
    x = rand((n, 3, h, w), low=-1, high=1)
    wt, b = rand((64, 3, k, k), seed=1, low=-1, high=1) * 0.2, rand((64,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")

    def net(t):
        y = F.conv2d(t, wp, bp, stride=s, padding=p).relu()
        return F.max_pool2d(y, pk, ps, pp, dilation=pd, ceil_mode=ceil)

    f = plait.jit(net, device="cpu")
    got = np.asarray(f(x))
    assert _fused(f, x) and _packed_at_build(f, x)
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), s, p).relu()
    want = torch.nn.functional.max_pool2d(y, pk, ps, pp, pd, ceil_mode=ceil)
    assert got.shape == tuple(want.shape)
    assert_close(got, want.numpy(), "float32", f"stem + max pool {case}", tol_scale=10)


def test_stem_pool_batch_norm_negative_scale():
    """A batch norm after the stem (scale per channel, half of them negative) then ReLU: the epilogue runs before
    the maximum, so a negative scale still pools the right values."""
    x = rand((2, 3, 33, 35), low=-1, high=1)
    wt = rand((128, 3, 7, 7), seed=1, low=-1, high=1) * 0.2
    scale = rand((128,), seed=3, low=-1, high=1)
    shift = rand((128,), seed=4)
    wp, sp, hp = (plait.tensor(a, device="cpu") for a in (wt, scale, shift))
    f = plait.jit(
        lambda t: F.max_pool2d(
            (F.conv2d(t, wp, stride=2, padding=3) * sp.reshape(1, 128, 1, 1) + hp.reshape(1, 128, 1, 1)).relu(), 3, 2, 1
        ),
        device="cpu",
    )
    got = np.asarray(f(x))
    assert _fused(f, x)
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), None, 2, 3)
    y = (y * torch.from_numpy(scale).reshape(1, 128, 1, 1) + torch.from_numpy(shift).reshape(1, 128, 1, 1)).relu()
    assert_close(got, torch.nn.functional.max_pool2d(y, 3, 2, 1).numpy(), "float32", "stem + bn + pool", tol_scale=10)


def test_stem_pool_weights_as_inputs():
    """Weights passed to the plan are packed on every call: two calls with different weights each match PyTorch."""
    x = rand((1, 3, 29, 31), low=-1, high=1)
    f = plait.jit(lambda t, wt: F.max_pool2d(F.conv2d(t, wt, stride=2, padding=3).relu(), 3, 2, 1), device="cpu")
    for seed in (1, 2):
        wt = rand((64, 3, 7, 7), seed=seed, low=-1, high=1) * 0.2
        got = np.asarray(f(x, wt))
        assert _fused(f, x, wt) and not _packed_at_build(f, x, wt)
        y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), None, 2, 3).relu()
        assert_close(
            got, torch.nn.functional.max_pool2d(y, 3, 2, 1).numpy(), "float32", f"weights {seed}", tol_scale=10
        )


def test_stem_read_elsewhere_keeps_two_kernels():
    """When the stem's output is also an output of the function, the stem and the pool stay two kernels."""
    x = rand((1, 3, 29, 31), low=-1, high=1)
    wt = rand((64, 3, 7, 7), seed=1, low=-1, high=1) * 0.2
    wp = plait.tensor(wt, device="cpu")

    def net(t):
        y = F.conv2d(t, wp, stride=2, padding=3).relu()
        return y, F.max_pool2d(y, 3, 2, 1)

    f = plait.jit(net, device="cpu")
    y, z = (np.asarray(a) for a in f(x))
    assert not _fused(f, x)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), None, 2, 3).relu()
    assert_close(y, want.numpy(), "float32", "stem output", tol_scale=10)
    assert_close(z, torch.nn.functional.max_pool2d(want, 3, 2, 1).numpy(), "float32", "unfused pool", tol_scale=10)


@pytest.mark.parametrize(
    "w,at",
    [(41, [(1, 5, 7, np.nan), (2, 30, 35, np.inf)]), (43, [(0, 10, 42, np.nan)])],
    ids=["nan-and-inf", "nan-in-the-last-pixels"],
)
def test_stem_pool_nan_and_infinity(w, at):
    """A NaN and an infinity in the image (no ReLU, which plait's epilogue takes to 0 for a NaN): the windows that
    read the stem's NaN outputs pool to NaN (as in PyTorch), the others to the same values. The second image's NaN
    reaches only the last two of its rows' 22 conv pixels, past the row test's blocks of four."""
    x = rand((1, 3, 37, w), low=-1, high=1)
    for c, i, j, v in at:
        x[0, c, i, j] = v
    wt, b = rand((64, 3, 7, 7), seed=1, low=-1, high=1) * 0.2, rand((64,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.max_pool2d(F.conv2d(t, wp, bp, stride=2, padding=3), 3, 2, 1), device="cpu")
    got = np.asarray(f(x))
    assert _fused(f, x)
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), 2, 3)
    want = torch.nn.functional.max_pool2d(y, 3, 2, 1).numpy()
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want).any()
    finite = np.isfinite(want)
    assert_close(got[finite], want[finite], "float32", "stem + pool around a NaN", tol_scale=10)


def test_stem_pool_same_bits_whichever_thread_takes_a_band():
    """The bands go out in guided chunks (stem_pool_c.SCHEDULE), so which thread computes which band, and so which
    conv rows a thread keeps from its previous band or computes again, changes from call to call (a pause before a
    call lets the main thread start alone): every call gives the same bits, and torch's result."""
    x = rand((2, 3, 45, 37), low=-1, high=1)
    wt, b = rand((64, 3, 7, 7), seed=1, low=-1, high=1) * 0.2, rand((64,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.max_pool2d(F.conv2d(t, wp, bp, stride=2, padding=3).relu(), 3, 2, 1), device="cpu")
    first = np.asarray(f(x)).copy()
    assert _fused(f, x)
    for i in range(6):
        time.sleep(0.02 * (i % 3))
        np.testing.assert_array_equal(np.asarray(f(x)), first)
    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), 2, 3).relu()
    assert_close(first, torch.nn.functional.max_pool2d(y, 3, 2, 1).numpy(), "float32", "stem + pool, guided", 10)
