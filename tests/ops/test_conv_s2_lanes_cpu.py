"""The cpu's stride-2 3x3 convolution with output channels across the vector lanes (plait/codegen/conv_s2_c.py:
weights packed at plan build, bands of input rows split into even and odd columns, resnet's downsampling layers).
Checked against PyTorch on odd and even planes, padding 0-2, rows of 14-29 pixels (partial and whole pixel tiles and
VW x VW transposes), uneven bands, input channels that are not a multiple of the lanes, output channels that fill
part of a panel, batches, a fused epilogue with a residual, and weights as plan inputs (the GEMM), at one to three
threads."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c
from tests.helpers import assert_close, rand

CASES = [  # n, cin, h, w, cout, padding
    (1, 16, 28, 28, 64, 1),  # 14x14 outputs (resnet's layer3): two bands of 7 rows, one panel
    (2, 24, 31, 29, 48, 1),  # two images, 16x15 outputs, 24 input channels, three 16-channel groups of a panel
    (1, 20, 58, 57, 128, 1),  # 29x29 outputs: four bands of 8 (the last 5), two panels, a partial transpose
    (1, 17, 30, 33, 32, 0),  # no padding: 14x16 outputs, 17 input channels
    (2, 16, 29, 27, 80, 2),  # padding 2, two images of 16x15 outputs, a panel and a 16-channel remainder
    # images enough for every thread: bands of up to S2_BATCH_BAND_ROWS rows (29 rows: two of 15 and 14)
    (6, 16, 58, 58, 32, 1),
    (5, 24, 28, 28, 48, 1),  # 14x14 outputs, one band an image
]


def _conv(case, residual: bool):
    n, cin, h, w, cout, p = case
    x = rand((n, cin, h, w), low=-1, high=1)
    wt, b = rand((cout, cin, 3, 3), seed=1, low=-1, high=1) * 0.2, rand((cout,), seed=2)
    oh, ow = (h + 2 * p - 3) // 2 + 1, (w + 2 * p - 3) // 2 + 1
    r = rand((n, cout, oh, ow), seed=3)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    if residual:
        f = plait.jit(lambda t, s: (F.conv2d(t, wp, bp, stride=2, padding=p) + s).relu(), device="cpu")
        args = [x, r]
    else:
        f = plait.jit(lambda t: F.conv2d(t, wp, bp, stride=2, padding=p).relu(), device="cpu")
        args = [x]
    got = np.asarray(f(*args))
    plan, _ = f.plan_for(args)
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), 2, p)
    if residual:
        want = want + torch.from_numpy(r)
    return got, want.relu().numpy(), [kern.name for kern in plan.kernels]


@pytest.mark.parametrize("case", CASES)
def test_s2_lanes_matches_torch(case, team_size):
    """At one, two and three threads: with fewer bands than tasks wanted, each thread takes a run of panels over
    every band (S2_CHUNK_MAJOR), so every band is split by more than one thread."""
    got, want, names = _conv(case, residual=False)
    assert sum(name.startswith("S2CONV_") for name in names) == 1, names
    assert_close(got, want, "float32", f"stride-2 lanes conv {case}", tol_scale=10)


def test_s2_lanes_residual_epilogue():
    """The fused epilogue (bias, residual add, ReLU) runs on each panel's rows of each band."""
    got, want, names = _conv((2, 16, 30, 30, 64, 1), residual=True)
    assert sum(name.startswith("S2CONV_") for name in names) == 1, names
    assert_close(got, want, "float32", "stride-2 lanes conv with a residual", tol_scale=10)


def test_s2_lanes_choice():
    """Output channels not a multiple of the vector width, fewer than 16 input channels, stride 1, a 5x5 window or 7x7 output
    planes (conv_s2_c.S2_MIN_PIXELS, at any batch) keep the GEMM."""
    for cin, cout, stride, k, hw in (
        (16, gemm_c.VW * 3 // 2, 2, 3, 32),
        (8, 64, 2, 3, 32),
        (16, 64, 1, 3, 32),
        (16, 64, 2, 5, 32),
        (16, 64, 2, 3, 14),
    ):
        x = rand((4 if hw == 14 else 1, cin, hw, hw), low=-1, high=1)  # four 7x7 planes: 196 pixels in all
        wp = plait.tensor(rand((cout, cin, k, k), seed=1) * 0.2, device="cpu")
        f = plait.jit(lambda t, wp=wp, stride=stride: F.conv2d(t, wp, stride=stride, padding=1), device="cpu")
        f(x)
        plan, _ = f.plan_for([x])
        assert not any(kern.name.startswith("S2CONV_") for kern in plan.kernels), (cin, cout, stride, k, hw)


def test_s2_weights_as_inputs_keep_the_gemm():
    """Weights passed to the plan (not constants) are read in place by the implicit GEMM on every call: two calls
    with different weights each match PyTorch."""
    x = rand((1, 16, 15, 15), low=-1, high=1)
    f = plait.jit(lambda t, wt: F.conv2d(t, wt, stride=2, padding=1), device="cpu")
    for seed in (1, 2):
        wt = rand((64, 16, 3, 3), seed=seed, low=-1, high=1) * 0.2
        got = np.asarray(f(x, wt))
        want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), None, 2, 1)
        assert_close(got, want.numpy(), "float32", f"stride-2 conv, weights {seed}", tol_scale=10)
    plan, _ = f.plan_for([x, wt])
    assert not any(kern.name.startswith("S2CONV_") for kern in plan.kernels), [k.name for k in plan.kernels]


def test_s2_lanes_last_weight_from_memory_computes_the_same(monkeypatch):
    """A tile of 7 pixels (14-pixel rows; 4 x 7 with 16-float vectors, 2 x 7 with fewer) needs more than the
    vector registers, so it reads its last weight vector from L1 for every pixel (gemm_c.DIRECT_LANES_WMEM, which
    keeps its accumulators in registers): the same sums in the same order as holding it, bit for bit."""
    monkeypatch.setattr(gemm_c, "DIRECT_LANES_PX", (7,))  # with 16-float vectors the tile lanes_pixels(14) picks
    cv = gemm_c.DIRECT_LANES_CV
    assert gemm_c.DIRECT_LANES_WMEM and gemm_c.lanes_pixels(14) == 7 and cv * 7 + cv + 1 > gemm_c.VECTOR_REGS
    got, want, _ = _conv(CASES[0], residual=False)
    monkeypatch.setattr(gemm_c, "DIRECT_LANES_WMEM", False)
    held, _, _ = _conv(CASES[0], residual=False)
    assert np.array_equal(got, held)
    assert_close(got, want, "float32", "stride-2 lanes conv, 7-pixel tile", tol_scale=10)


@pytest.mark.parametrize("n", [1, 6])
def test_s2_lanes_as_a_team_step(n, team_size):
    """Inside a team run (with a second kernel after it), every thread of the team runs the stride-2 kernel's task
    loop (static shares with stealing): none of its tasks is left undone at one to three threads."""
    x = rand((n, 24, 30, 30), low=-1, high=1)
    wt = rand((48, 24, 3, 3), seed=1, low=-1, high=1) * 0.2
    wp = plait.tensor(wt, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, stride=2, padding=1).relu().mean(axis=(2, 3)), device="cpu")
    plan, _ = f.plan_for([x])
    assert sum(k.name.startswith("S2CONV_") for k in plan.kernels) == 1 and len(plan.kernels) > 1
    for k in plan.kernels:  # a kernel whose tasks are shared by stealing is a worksharing step, not one thread's
        if "plait_steal_start(&" in k.source:
            assert f"#pragma omp single nowait\n  {k.name}_run(" not in k.source, k.name
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), None, 2, 1).relu().mean(dim=(2, 3))
    for _ in range(3):
        assert_close(np.asarray(f(x)), want.numpy(), "float32", f"stride-2 conv as a team step, batch {n}", 10)
