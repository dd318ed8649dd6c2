"""On OpenCL a training batch norm's normalised input (x - mean) * rs, read by the affine output, the backward's
channel sums and its input gradient, is recomputed by each reader rather than stored (scheduler.PLANE_RECOMPUTE_COST):
it reads one full-size buffer, so storing it only adds a write and a launch; the backward's two channel sums are one
reduction, and so are the forward's mean and variance. The cpu makes the statistics and the backward's two sums in
kernels of its own (plait/graph/ops/bnstat_c.py) and stores no normalised input either. Gradients against PyTorch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.schedule.plan import Plan
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand


def _step(device: str) -> tuple[list[plait.Tensor], list, Plan]:
    x = plait.tensor(rand((8, 4, 16, 16), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((4,), seed=2), device=device, requires_grad=True)
    b = plait.tensor(rand((4,), seed=3), device=device, requires_grad=True)
    y = F.hardtanh(F.batch_norm(x, None, None, w, b, training=True), 0.0, 6.0)
    loss = (y * y).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    g = autodiff.gradients(loss.node, seed, [x.node, w.node, b.node])
    grads = [g[t.node.uid] for t in (x, w, b)]
    return [x, w, b], grads, Plan([loss.node, *grads])


@pytest.mark.parametrize("device", DEVICES)
def test_normalised_input_not_stored(device: str) -> None:
    (x, _, _), grads, plan = _step(device)
    # a final output may be written by a kernel merging the small outputs (scheduler._merge_final_writes)
    full = [it.out for it in plan.items if it.kind in ("elementwise", "written") and it.out.size == x.node.size]
    products = [n for n in full if n.op == "mul" and n.dtype.name == "float32"]
    assert products == [grads[0]], [(n.op, n.shape) for n in full]  # only the input gradient itself


@pytest.mark.parametrize("device", DEVICES)
def test_batch_norm_relu6_gradients_match_torch(device: str) -> None:
    tensors, grads, _ = _step(device)
    got = [np.asarray(plait.Tensor(gr).numpy()) for gr in grads]
    ref = [torch.tensor(t.numpy(), requires_grad=True) for t in tensors]
    y = torch.nn.functional.hardtanh(torch.nn.functional.batch_norm(ref[0], None, None, ref[1], ref[2], True), 0, 6)
    (y * y).sum().backward()
    for name, g, r in zip(("input", "weight", "bias"), got, ref, strict=True):
        assert r.grad is not None
        assert_close(g, r.grad.numpy(), "float32", f"batch norm + ReLU6 {name} gradient", tol_scale=10.0)


@pytest.mark.parametrize("device", DEVICES)
def test_backward_channel_sums_paired_on_opencl(device: str) -> None:
    """OpenCL sums g and g * xhat per channel in one reduction over the two stacked (nn.functional's
    `_batch_norm_vjp`), and the forward's two moments in another (`_moments`): two per-channel sums of two values
    each, where the cpu has a kernel for each (plait/graph/ops/bnstat_c.py)."""
    _, _, plan = _step(device)
    sums = [it.out.shape for it in plan.items if it.kind == "reduce" and it.out.op == "rsum" and it.out.size in (4, 8)]
    if device.startswith("opencl"):
        assert len(sums) == 2 and all(math.prod(s) == 8 for s in sums), sums
    else:
        assert sums == [], sums
        kernels = sorted(it.out.op for it in plan.items if it.kind == "custom")
        assert kernels == ["bn_grad_sums_c", "bn_moments_c"], kernels


@pytest.mark.parametrize("device", DEVICES)
def test_training_moments_with_a_large_mean_match_float64(device: str) -> None:
    """Values around 1000 with a spread of 1 (a one-pass variance without the shift would lose most digits): the
    normalised output and the unbiased variance for the running average against float64."""
    xa = (1000.0 + rand((6, 3, 10, 10), seed=5)).astype(np.float32)
    out, mean, var = F.batch_norm_stats(plait.tensor(xa, device=device), None, None, None, None, True, 1e-5)
    x64 = xa.astype(np.float64)
    m64, v64 = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    ref = (x64 - m64.reshape(1, 3, 1, 1)) / np.sqrt(v64.reshape(1, 3, 1, 1) + 1e-5)
    assert mean is not None and var is not None
    assert_close(out.numpy(), ref, "float32", "batch norm output, mean 1000", tol_scale=10.0)
    assert_close(mean.numpy(), m64, "float32", "batch mean, mean 1000")
    assert_close(var.numpy(), v64 * 600 / 599, "float32", "unbiased batch variance, mean 1000", tol_scale=10.0)
