"""Winograd F(2,5) for 5x5 stride-1 convolutions on the `cpu` device (plait/codegen/winograd_c.py, a plan's r = 5)
against PyTorch in float64: tile edges, padding 0-2, batches, channel counts off the register tile and the vector
width, a fused epilogue, and the rule that keeps it to constant weights with enough channels.

Tolerance: F(2,5)'s transforms scale inputs by up to 8 (its G carries 1/24 .. 2/3, its B^T is F(4,3)'s), so the FP32
error is that of F(4,3): every output within 5e-5 of the largest reference magnitude.
"""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F

TOL = 5e-5

GEOMETRIES = [  # n, c, k, h, w, padding
    (1, 32, 40, 11, 13, 2),  # odd output: tiles cut by both edges
    (2, 33, 32, 9, 9, 0),  # no padding, input channels off the vector width
    (3, 48, 50, 7, 8, 1),  # three images in one tile block, output channels off the register tile
    (1, 32, 32, 6, 37, 2),  # 19 tile columns: a row's tiles in two 16-tile chunks of the gather
]


def _data(n, c, k, h, w, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((k, c, 5, 5)) / np.sqrt(25 * c)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    return x, wt, b


def _ref(x, w, b, padding):
    out = torch.nn.functional.conv2d(*(torch.tensor(a, dtype=torch.float64) for a in (x, w, b)), padding=padding)
    return torch.relu(out).numpy()


def _check(got, want, what):
    scale = float(np.abs(want).max())
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= TOL * scale, f"{what}: max error {err:.3g} > {TOL} x {scale:.3g}"


def _kinds(plan):
    return [k.name.split("_")[0] for k in plan.kernels]


@pytest.mark.parametrize("geo", GEOMETRIES, ids=lambda g: "x".join(map(str, g)))
def test_winograd_f25_matches_torch(geo):
    n, c, k, h, w, pad = geo
    x, wt, b = _data(n, c, k, h, w)
    weight, bias = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=pad).relu(), device="cpu")
    plan, _ = f.plan_for([x])
    # the 5x5 product runs as F(2,5) with bias and ReLU in its epilogue; its name counts the 25 taps
    assert _kinds(plan) == ["WINO2"]
    assert f"x{c * 25}_" in plan.kernels[0].name
    _check(f(x), _ref(x, wt, b, pad), f"F(2,5) {geo}")
    x2 = _data(n, c, k, h, w, seed=1)[0]
    _check(f(x2), _ref(x2, wt, b, pad), f"F(2,5) {geo}, second input")


def test_winograd_f25_not_for_weights_as_inputs_or_few_channels():
    """A weight that is a plan input (a training step's parameter) and a layer with fewer than 32 input channels keep
    the implicit GEMM: both give torch's result."""
    n, c, k, h, w = 1, 32, 32, 10, 10
    x, wt, b = _data(n, c, k, h, w)
    bias = plait.tensor(b, device="cpu")
    f = plait.jit(lambda t, u: F.conv2d(t, u, bias, padding=2).relu(), device="cpu")
    plan, _ = f.plan_for([x, wt])
    assert "WINO2" not in _kinds(plan)
    _check(f(x, wt), _ref(x, wt, b, 2), "weight as a plan input")
    x3, wt3, b3 = _data(1, 16, 32, 10, 10)
    weight3, bias3 = plait.tensor(wt3, device="cpu"), plait.tensor(b3, device="cpu")
    g = plait.jit(lambda t: F.conv2d(t, weight3, bias3, padding=2).relu(), device="cpu")
    plan3, _ = g.plan_for([x3])
    assert "WINO2" not in _kinds(plan3)
    _check(g(x3), _ref(x3, wt3, b3, 2), "16 input channels")
