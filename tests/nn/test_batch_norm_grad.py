"""Training batch norm's closed-form gradient (`nn.functional._batch_norm_vjp`) against PyTorch on every available
device, with and without the affine parameters, through a ReLU as in a network, and the sums it leaves in a plan."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.schedule.scheduler import schedule
from tests.helpers import assert_close, rand

CASES = [((4, 3, 5, 6), True), ((8, 5), True), ((3, 4, 7), False)]


@pytest.mark.parametrize(("shape", "affine"), CASES, ids=[f"{s}-{'affine' if a else 'plain'}" for s, a in CASES])
def test_training_batch_norm_gradient_matches_torch(device: str, shape: tuple, affine: bool) -> None:
    c = shape[1]
    xa, wa, ba, ga = rand(shape, seed=1) * 2 + 1, rand((c,), seed=2), rand((c,), seed=3), rand(shape, seed=4)
    x = plait.tensor(xa, device=device, requires_grad=True)
    w = plait.tensor(wa, device=device, requires_grad=True) if affine else None
    b = plait.tensor(ba, device=device, requires_grad=True) if affine else None
    xt = torch.tensor(xa, requires_grad=True)
    wt = torch.tensor(wa, requires_grad=True) if affine else None
    bt = torch.tensor(ba, requires_grad=True) if affine else None
    out = F.batch_norm(x, None, None, w, b, training=True)
    ref = torch.nn.functional.batch_norm(xt, None, None, wt, bt, training=True)
    assert_close(out.numpy(), ref.detach().numpy(), "float32", "batch norm forward")
    (out.relu() * plait.tensor(ga, device=device)).sum().backward()
    (torch.relu(ref) * torch.tensor(ga)).sum().backward()
    assert x.grad is not None
    assert_close(x.grad.numpy(), xt.grad.numpy(), "float32", "batch norm input gradient", tol_scale=10)
    for p, pt, what in ((w, wt, "weight"), (b, bt, "bias")):
        if p is not None and pt is not None:
            assert p.grad is not None
            assert_close(p.grad.numpy(), pt.grad.numpy(), "float32", f"batch norm {what} gradient", tol_scale=10)


def test_training_batch_norm_backward_has_two_channel_sums() -> None:
    """The backward of a training batch norm sums two things per channel (the gradient and the gradient times the
    normalised input), where the op-by-op gradient of the mean and the variance made four sums. On the cpu the
    forward's mean and variance come from one kernel with both outputs, and so do the backward's two sums
    (plait/graph/ops/bnstat_c.py): no reduction over the activations is left."""
    x = plait.tensor(rand((4, 16, 8, 8), seed=1), device="cpu", requires_grad=True)
    w = plait.tensor(rand((16,), seed=2), device="cpu", requires_grad=True)
    b = plait.tensor(rand((16,), seed=3), device="cpu", requires_grad=True)
    loss = (F.batch_norm(x, None, None, w, b, training=True).relu() * plait.tensor(rand((4, 16, 8, 8), seed=4))).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
    grads = autodiff.gradients(loss.node, seed, [x.node, w.node, b.node])
    items = schedule([grads[x.node.uid], grads[w.node.uid], grads[b.node.uid]], 1)
    reductions = [it.out.shape for it in items if it.kind == "reduce"]
    assert reductions == [], reductions
    assert sorted(it.out.op for it in items if it.kind == "custom") == ["bn_grad_sums_c", "bn_moments_c"]


def test_cpu_statistics_match_float64() -> None:
    """The cpu kernels' mean and variance, with a mean far from zero (1000 against a spread of 1, where a one-pass
    sum of squares cancels), planes whose length is no multiple of the vector (7x9), and a folded convolution's
    output read through its (C, N, H, W) layout; the backward's two sums against float64."""
    xa = rand((5, 6, 7, 9), seed=5) + np.float32(1000.0)
    for x in (
        plait.tensor(xa, device="cpu"),
        plait.tensor(np.ascontiguousarray(xa.transpose(1, 0, 2, 3)), device="cpu").permute(1, 0, 2, 3),
    ):
        m = plait.Tensor(F.bnstat_c.bn_moments_c(x.node, 1e-5)).numpy()
        x64 = xa.astype(np.float64)
        assert_close(m[0], x64.mean(axis=(0, 2, 3)), "float32", "bn_moments_c mean")
        assert_close(m[1], x64.var(axis=(0, 2, 3)), "float32", "bn_moments_c variance", tol_scale=10)
        assert_close(m[2], 1 / np.sqrt(x64.var(axis=(0, 2, 3)) + 1e-5), "float32", "bn_moments_c 1/std", tol_scale=10)
    ga, xb = rand((3, 4, 5, 21), seed=6), rand((3, 4, 5, 21), seed=7) + np.float32(50.0)
    g, xt = (plait.tensor(a, device="cpu") for a in (ga, xb))
    st = plait.Tensor(F.bnstat_c.bn_grad_sums_c(g.node, xt.node, F.bnstat_c.bn_moments_c(xt.node, 1e-5))).numpy()
    g64, d64 = ga.astype(np.float64), xb - xb.astype(np.float64).mean(axis=(0, 2, 3), keepdims=True)
    assert_close(st[0], g64.sum(axis=(0, 2, 3)), "float32", "bn_grad_sums_c sum of g", tol_scale=10)
    assert_close(
        st[1], (g64 * d64).sum(axis=(0, 2, 3)), "float32", "bn_grad_sums_c sum of g * (x - mean)", tol_scale=10
    )


def test_cpu_statistics_refuse_bad_input() -> None:
    g = plait.tensor(rand((2, 3, 4, 4)), device="cpu").node
    x = plait.tensor(rand((2, 3, 4, 5)), device="cpu").node
    with pytest.raises(F.ShapeError, match="bn_grad_sums_c"):
        F.bnstat_c.bn_grad_sums_c(g, x, F.bnstat_c.bn_moments_c(x, 1e-5))
    with pytest.raises(F.UnsupportedError, match="spatial axis"):
        F.bnstat_c.bn_moments_c(plait.tensor(rand((8, 3)), device="cpu").node, 1e-5)
