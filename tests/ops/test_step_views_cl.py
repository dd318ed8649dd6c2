"""OpenCL training-step schedule: a gradient that reaches its parameter's shape through views that keep the
element order (a reshape of a permute and its inverse, a reshape of a reshape) aliases the reduction's buffer
instead of copying it (`scheduler._identity_view`); checked against PyTorch and in the schedule's items."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.runtime import get_device
from plait.schedule.plan import Plan
from plait.schedule.scheduler import schedule
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]


def _conv_grads(device: str) -> tuple[plait.Tensor, plait.Tensor, plait.Tensor]:
    x = plait.tensor(rand((2, 3, 12, 12)), device=device)
    w = plait.tensor(rand((4, 3, 3, 3), seed=1), device=device, requires_grad=True)
    b = plait.tensor(rand((4,), seed=2), device=device, requires_grad=True)
    return x, w, b


@pytest.mark.parametrize("device", CL_DEVICES)
def test_bias_and_weight_gradients_alias_their_sums(device: str) -> None:
    x, w, b = _conv_grads(device)
    y = F.conv2d(x, w, b, padding=1)
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    g = autodiff.gradients((y * y).sum().node, seed, [w.node, b.node])
    r = get_device(device).renderer
    items = schedule(
        [g[w.node.uid], g[b.node.uid]],
        r.__dict__.get("split_parts", 256),
        implicit_conv=r.implicit_conv,
        conv_span=r.conv_span,
        split_k=r.split_k,
        winograd_cl=True,
    )
    kinds = {it.out.shape: it.kind for it in items if it.out.op == "reshape"}
    assert kinds == {(4, 3, 3, 3): "alias", (4,): "alias"}
    assert all(it.inputs[0].op in ("rsum", "rsplit") for it in items if it.kind == "alias")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_aliased_gradients_match_torch(device: str) -> None:
    x, w, b = _conv_grads(device)
    y = F.conv2d(x, w, b, padding=1)
    (y * y).sum().backward()
    wt = torch.tensor(w.numpy(), requires_grad=True)
    bt = torch.tensor(b.numpy(), requires_grad=True)
    yt = torch.nn.functional.conv2d(torch.tensor(x.numpy()), wt, bt, padding=1)
    (yt * yt).sum().backward()
    assert w.grad is not None and b.grad is not None and wt.grad is not None and bt.grad is not None
    assert_close(w.grad.numpy(), wt.grad.numpy(), "float32", "conv weight gradient")
    assert_close(b.grad.numpy(), bt.grad.numpy(), "float32", "conv bias gradient")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_updates_of_different_sizes_in_one_kernel(device: str) -> None:
    """SGD-like updates of 3, 300, 7x5 and 1 values, none read afterwards, run as one kernel over their
    concatenation (`scheduler._merge_final_writes`, `OpenCLRenderer.render_elementwise_group`), against NumPy."""
    shapes = [(3,), (300,), (7, 5), (1,)]
    ps = [rand(s, seed=i) for i, s in enumerate(shapes)]
    gs = [rand(s, seed=10 + i) for i, s in enumerate(shapes)]
    outs = [
        (plait.tensor(p, device=device) - plait.tensor(g, device=device) * 0.1).node
        for p, g in zip(ps, gs, strict=True)
    ]
    plan = Plan(outs)
    assert [k.writes for k in plan.kernels] == [4]
    for o, p, g in zip(plan(), ps, gs, strict=True):
        np.testing.assert_allclose(np.asarray(o), p - np.float32(0.1) * g, rtol=1e-6, atol=1e-7)
