"""A linear layer's gradients on OpenCL (`plait.nn.functional._linear_vjp`): the input's dy @ W and the weight's
dy^T @ x written in the weight's (out, in) layout, against PyTorch; the weight's gradient is the product itself,
with no transposing copy after it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.schedule.plan import Plan
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("shape", [(5, 12), (2, 3, 12), (12,)], ids=["rows", "batched", "vector"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_linear_gradients_match_torch(device: str, shape: tuple[int, ...], bias: bool) -> None:
    xa, wa, ba = rand(shape, seed=1), rand((7, 12), seed=2), rand((7,), seed=3)
    x = plait.tensor(xa, device=device, requires_grad=True)
    w = plait.tensor(wa, device=device, requires_grad=True)
    b = plait.tensor(ba, device=device, requires_grad=True) if bias else None
    xt, wt = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
    bt = torch.tensor(ba, requires_grad=True) if bias else None
    out, ref = F.linear(x, w, b), torch.nn.functional.linear(xt, wt, bt)
    assert_close(out.numpy(), ref.detach().numpy(), "float32", "linear forward")
    ga = rand(tuple(ref.shape), seed=4)
    (out * plait.tensor(ga, device=device)).sum().backward()
    (ref * torch.tensor(ga)).sum().backward()
    assert x.grad is not None and w.grad is not None and xt.grad is not None and wt.grad is not None
    assert_close(x.grad.numpy(), xt.grad.numpy(), "float32", "linear input gradient")
    assert_close(w.grad.numpy(), wt.grad.numpy(), "float32", "linear weight gradient")
    if bias:
        assert b is not None and b.grad is not None and bt is not None and bt.grad is not None
        assert_close(b.grad.numpy(), bt.grad.numpy(), "float32", "linear bias gradient")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_weight_gradient_is_written_in_place(device: str) -> None:
    """The weight's gradient is a GEMM's own output (no elementwise transpose of an (in, out) product)."""
    x = plait.tensor(rand((4, 24), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((16, 24), seed=2), device=device, requires_grad=True)
    loss = (F.linear(x, w) * 3.0).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    grads = autodiff.gradients(loss.node, seed, [x.node, w.node])
    dw = grads[w.node.uid]
    assert dw.op == "matmul" and dw.shape == (16, 24)
    items = Plan([loss.node, dw, grads[x.node.uid]]).items
    assert not any(it.out.shape in ((24, 16), (16, 24)) and it.kind == "elementwise" for it in items), items
