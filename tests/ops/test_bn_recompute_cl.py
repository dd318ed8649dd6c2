"""On OpenCL a training batch norm's normalised input (x - mean) * rs, read by the affine output, the backward's
channel sums and its input gradient, is recomputed by each reader rather than stored (scheduler.PLANE_RECOMPUTE_COST):
it reads one full-size buffer, so storing it only adds a write and a launch; and the backward's two channel sums are
one reduction. The cpu keeps storing it and sums twice. Gradients through the OpenCL form against PyTorch."""

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
def test_normalised_input_stored_only_on_the_cpu(device: str) -> None:
    (x, _, _), grads, plan = _step(device)
    full = [it.out for it in plan.items if it.kind == "elementwise" and it.out.size == x.node.size]
    products = [n for n in full if n.op == "mul" and n.dtype.name == "float32"]
    if device.startswith("opencl"):
        assert products == [grads[0]], [(n.op, n.shape) for n in full]  # only the input gradient itself
    else:
        assert len(products) == 2, [(n.op, n.shape) for n in full]  # the normalised input and the input gradient


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
    `_batch_norm_vjp`): with the forward's mean and variance, three per-channel sums where the cpu makes four."""
    _, _, plan = _step(device)
    sums = [it.out.shape for it in plan.items if it.kind == "reduce" and it.out.op == "rsum" and it.out.size in (4, 8)]
    if device.startswith("opencl"):
        assert len(sums) == 3 and sum(math.prod(s) == 8 for s in sums) == 1, sums
    else:
        assert len(sums) == 4, sums
