"""Batch norm with running statistics (inference) as one per-channel scale and shift: values and gradients against
torch, and the convolution's fused epilogue reading two per-channel operands (as for an exported model whose batch
norm was folded into the convolution) instead of four."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from tests.helpers import rand


@pytest.mark.parametrize("affine", [True, False])
def test_eval_batch_norm_matches_torch(device: str, affine: bool) -> None:
    x = rand((2, 5, 3, 4))
    mean, var = rand((5,), seed=1), np.abs(rand((5,), seed=2)) + 0.5
    w, b = rand((5,), seed=3), rand((5,), seed=4)
    g = rand((2, 5, 3, 4), seed=5)
    xp = plait.tensor(x, device=device, requires_grad=True)
    wp = plait.tensor(w, device=device, requires_grad=True) if affine else None
    bp = plait.tensor(b, device=device, requires_grad=True) if affine else None
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(w, requires_grad=True) if affine else None
    bt = torch.tensor(b, requires_grad=True) if affine else None
    mp, vp = plait.tensor(mean, device=device), plait.tensor(var, device=device)
    out = F.batch_norm(xp, mp, vp, wp, bp, training=False, eps=1e-3)
    ref = torch.nn.functional.batch_norm(xt, torch.tensor(mean), torch.tensor(var), wt, bt, False, 0.1, 1e-3)
    np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    (out * plait.tensor(g, device=device)).sum().backward()
    (ref * torch.tensor(g)).sum().backward()
    pairs = [(xp, xt)] + ([(wp, wt), (bp, bt)] if affine else [])
    for p, t in pairs:
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_eval_batch_norm_is_a_two_operand_epilogue() -> None:
    """conv -> batch norm (eval) -> ReLU6 is one kernel on the cpu whose epilogue reads a scale and a shift."""
    x, k = rand((1, 8, 6, 6)), rand((8, 1, 3, 3), seed=1)
    mean, var = rand((8,), seed=2), np.abs(rand((8,), seed=3)) + 0.5
    w, b = rand((8,), seed=4), rand((8,), seed=5)
    params = [plait.tensor(a, device="cpu") for a in (k, mean, var, w, b)]

    def fn(t: plait.Tensor) -> plait.Tensor:
        y = F.conv2d(t, params[0], None, 1, 1, 1, 8)
        return F.batch_norm(y, params[1], params[2], params[3], params[4], training=False).clip(0.0, 6.0)

    jit = plait.jit(fn, device="cpu")
    plan, _ = jit.plan_for([x])
    (kernel,) = plan.kernels
    assert "extra[1]" in kernel.source and "extra[2]" not in kernel.source, kernel.name
    ref = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(k), None, 1, 1, 1, 8)
    ref = torch.nn.functional.batch_norm(ref, torch.tensor(mean), torch.tensor(var), torch.tensor(w), torch.tensor(b))
    np.testing.assert_allclose(jit(x), ref.clamp(0.0, 6.0).numpy(), rtol=1e-4, atol=1e-5)
