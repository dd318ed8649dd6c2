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
    normalised input): with the forward's mean and variance, four reductions in all where the op-by-op gradient
    of the mean and the variance made six. On the cpu each is summed over the planes, then over the images
    (nn.functional._channel_sums): four reductions read the activations, four more their (4, 16) plane sums."""
    x = plait.tensor(rand((4, 16, 8, 8), seed=1), device="cpu", requires_grad=True)
    w = plait.tensor(rand((16,), seed=2), device="cpu", requires_grad=True)
    b = plait.tensor(rand((16,), seed=3), device="cpu", requires_grad=True)
    loss = (F.batch_norm(x, None, None, w, b, training=True).relu() * plait.tensor(rand((4, 16, 8, 8), seed=4))).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
    grads = autodiff.gradients(loss.node, seed, [x.node, w.node, b.node])
    items = schedule([grads[x.node.uid], grads[w.node.uid], grads[b.node.uid]], 1)
    reductions = [it.out.shape for it in items if it.kind == "reduce"]
    assert sorted(reductions) == [(1, 16)] * 4 + [(4, 16, 1)] * 4, reductions
