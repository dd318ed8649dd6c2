"""The channels-last stride-1 weight gradient on the cpu (plait/codegen/wgrad_c.py, plait_wgrad_cl: x copied once
channels-last and padded, dy read in place, every output position counted once) against PyTorch in float64, and
the position-major stride-1 form it replaces on the same window."""

import numpy as np
import pytest
import torch

import plait
from plait.codegen import wgrad_c
from plait.graph.ops import conv_wgrad_c
from plait.graph.ops.conv import Window

CASES = [  # n, c, h, w, co, k, padding, dilation
    (2, 64, 9, 7, 13, 3, 1, 1),  # rectangular plane, 13 output channels: a last tile of one row
    (3, 128, 5, 5, 7, 3, 0, 1),  # no padding, two channel blocks
    (1, 64, 12, 10, 20, 3, 2, 2),  # dilated
    (2, 64, 6, 6, 6, 5, 2, 1),  # a 5x5 window
    (2, 64, 4, 4, 100, 3, 1, 1),  # 100 output channels: two column chunks
    (2, 64, 20, 20, 8, 3, 1, 1),  # 20x20 output: blocks of 6 rows, the last of 2
]


def _grad(win: Window, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    node = conv_wgrad_c.conv_wgrad_c(plait.tensor(dy, device="cpu").node, plait.tensor(x, device="cpu").node, win)
    return plait.Tensor(node).numpy()


@pytest.fixture(autouse=True)
def _from_64_channels(monkeypatch):
    """The kernel's tests run from 64 channels (small cases); the choice's own threshold is tested below."""
    monkeypatch.setattr(wgrad_c, "CL_MIN_CHANNELS", 64)


@pytest.mark.parametrize("case", CASES)
def test_channels_last_weight_gradient_matches_torch(case):
    n, c, h, w, co, k, p, d = case
    win = Window(n, c, h, w, k, k, 1, 1, p, p, d, d)
    assert wgrad_c.channels_last(win)
    rng = np.random.default_rng(len(CASES) + n * c + co)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    dy = rng.standard_normal((n, co, win.oh, win.ow)).astype(np.float32)
    want = torch.nn.grad.conv2d_weight(
        torch.from_numpy(x).double(), (co, c, k, k), torch.from_numpy(dy).double(), 1, p, d
    ).numpy()
    got = _grad(win, x, dy)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_channels_last_agrees_with_position_major_form(monkeypatch):
    """The same window through both stride-1 forms: equal up to float32 summation order."""
    win = Window(2, 64, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 64, 8, 8)).astype(np.float32)
    dy = rng.standard_normal((2, 12, 8, 8)).astype(np.float32)
    cl = _grad(win, x, dy)
    monkeypatch.setattr(wgrad_c, "CL_ENABLED", 0)
    assert not wgrad_c.channels_last(win)
    pm = _grad(win, x, dy)
    np.testing.assert_allclose(cl, pm, rtol=0, atol=1e-5 * np.abs(pm).max())


def test_channels_last_needs_whole_channel_tiles(monkeypatch):
    """Channels that do not fill whole tiles, 1x1 windows and strided windows keep the other forms; so do 64
    channels under the committed threshold."""
    assert wgrad_c.channels_last(Window(2, 64, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1))
    monkeypatch.setattr(wgrad_c, "CL_MIN_CHANNELS", 128)
    assert not wgrad_c.channels_last(Window(2, 64, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1))
    assert wgrad_c.channels_last(Window(2, 128, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1))
    assert not wgrad_c.channels_last(Window(2, 48, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1))
    assert not wgrad_c.channels_last(Window(2, 64, 8, 8, 1, 1, 1, 1, 0, 0, 1, 1))
    assert not wgrad_c.channels_last(Window(2, 64, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1))
