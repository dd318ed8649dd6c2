"""Winograd on the cpu where the weight is transformed on every call (a training step's parameters): the per-layer
choice from 784 output positions (winograd_c.PER_CALL_MIN_POSITIONS), a weight passed in per call, and a training
convolution on 7x7 planes whose forward and input gradient run with F(4,3), against PyTorch in float64."""

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm, winograd_c
from plait.schedule.plan import Plan

TOL = 5e-5  # F(4,3)'s bound relative to the largest reference magnitude (tests/ops/test_winograd.py)


def _spec(n: int, c: int, k: int, hw: int) -> gemm.GemmSpec:
    win = F.Window(n, c, hw, hw, 3, 3, 1, 1, 1, 1, 1, 1)
    return gemm.GemmSpec(n, k, hw * hw, c * 9, (0, 0, c * 9, 1), (0, 0, 0, 0), conv=win)


def _close(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    ref = want.detach().numpy()
    scale = float(np.abs(ref).max())
    err = float(np.abs(got.astype(np.float64) - ref).max())
    assert err <= TOL * scale, f"{what}: max error {err:.3g} > {TOL} x {scale:.3g}"


def test_per_call_choice_from_784_positions():
    """resnet18 b16's 512-channel 7x7 layer (784 positions) takes F(4,3) with its weight transformed per call; half
    the batch (392) stays on the implicit GEMM; a constant weight's choice is unchanged."""
    plan = winograd_c.pick(_spec(16, 512, 512, 7), constant_weight=False)
    assert plan is not None and plan.m == 4
    assert winograd_c.pick(_spec(8, 512, 512, 7), constant_weight=False) is None
    constant = winograd_c.pick(_spec(8, 512, 512, 7), constant_weight=True)
    assert constant is not None and constant.m == 4


def test_training_convolution_on_7x7_planes_matches_torch():
    """Gradients recorded for a 3x3 convolution on 7x7 planes at batch 16 (784 positions, layer4's shape scaled down
    to 32 channels): the forward runs per image and, like the input gradient, with F(4,3); output and both
    gradients against float64."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32, 7, 7)).astype(np.float32)
    wt = (rng.standard_normal((32, 32, 3, 3)) / np.sqrt(9 * 32)).astype(np.float32)
    up = rng.standard_normal((16, 32, 7, 7)).astype(np.float32)
    xp = plait.tensor(x, device="cpu", requires_grad=True)
    wp = plait.tensor(wt, device="cpu", requires_grad=True)
    out = F.conv2d(xp, wp, None, padding=1)
    kinds = [k.name.split("_")[0] for k in Plan([out.node]).kernels]
    assert "WINO4" in kinds and "GEMM" not in kinds, kinds
    (out * plait.tensor(up, device="cpu")).sum().backward()
    xt, wtt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, wt))
    ref = torch.nn.functional.conv2d(xt, wtt, padding=1)
    (ref * torch.tensor(up, dtype=torch.float64)).sum().backward()
    assert xp.grad is not None and wp.grad is not None and xt.grad is not None and wtt.grad is not None
    _close(out.numpy(), ref, "forward")
    _close(xp.grad.numpy(), xt.grad, "input gradient")
    _close(wp.grad.numpy(), wtt.grad, "weight gradient")
