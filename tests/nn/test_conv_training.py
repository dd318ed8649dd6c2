"""conv2d with its gradient recorded (the batch-folded training form: one GEMM per group for the forward, the weight
gradient and the input gradient) against PyTorch, forward and backward, on every available device."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from tests.helpers import assert_close, rand

CASES = [  # x shape, weight shape, conv2d keyword arguments
    ((2, 3, 9, 9), (16, 3, 3, 3), {"padding": 1}),
    ((3, 4, 8, 7), (16, 4, 3, 3), {"stride": 2, "padding": 1}),
    ((2, 8, 6, 6), (32, 8, 1, 1), {}),
    ((2, 8, 7, 7), (32, 8, 1, 1), {"stride": 2}),
    ((2, 4, 9, 8), (32, 2, 3, 2), {"padding": (2, 1), "dilation": (2, 1), "groups": 2}),
    ((2, 32, 6, 6), (32, 2, 1, 1), {"groups": 16}),  # two input channels and one row per group: per-image form
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}-{sorted(c[2].items())}" for c in CASES])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_conv2d_training_matches_torch(device: str, case: tuple, bias: bool) -> None:
    xs, ws, kw = case
    xa, wa, ba = rand(xs, seed=1), rand(ws, seed=2), rand((ws[0],), seed=3)
    ga = None
    x = plait.tensor(xa, device=device, requires_grad=True)
    w = plait.tensor(wa, device=device, requires_grad=True)
    b = plait.tensor(ba, device=device, requires_grad=True) if bias else None
    xt, wt = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
    bt = torch.tensor(ba, requires_grad=True) if bias else None
    out, ref = F.conv2d(x, w, b, **kw), torch.nn.functional.conv2d(xt, wt, bt, **kw)
    assert_close(out.numpy(), ref.detach().numpy(), "float32", "conv2d forward (training form)")
    ga = rand(tuple(ref.shape), seed=4)
    (out * plait.tensor(ga, device=device)).sum().backward()
    (ref * torch.tensor(ga)).sum().backward()
    assert x.grad is not None and w.grad is not None
    assert_close(x.grad.numpy(), xt.grad.numpy(), "float32", "conv2d input gradient")
    assert_close(w.grad.numpy(), wt.grad.numpy(), "float32", "conv2d weight gradient")
    if bias:
        assert b is not None and b.grad is not None
        assert_close(b.grad.numpy(), bt.grad.numpy(), "float32", "conv2d bias gradient")


def test_conv2d_training_weight_gradient_is_one_product(device: str) -> None:
    """The weight gradient of a folded convolution is a single GEMM over every image's positions (K = N*OH*OW):
    no per-image product and no sum over the batch in the step's kernels. On the cpu it is computed transposed,
    columns @ dy^T (27 x 16), so the GEMM reads the large patch columns in place (nn.functional._conv_vjp); on
    OpenCL as dy @ columns^T (16 x 27), the columns gathered from the image (no im2col kernel)."""
    from plait.graph import autodiff
    from plait.schedule.plan import Plan

    x = plait.tensor(rand((4, 3, 8, 8), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((16, 3, 3, 3), seed=2), device=device, requires_grad=True)
    loss = F.conv2d(x, w, padding=1).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    grads = autodiff.gradients(loss.node, seed, [w.node])
    plan = Plan([grads[w.node.uid]])
    gemms = [it.gemm for it in plan.items if it.kind == "gemm"]
    assert len(gemms) == 1 and gemms[0] is not None
    spec = gemms[0]
    if device.startswith("opencl"):
        assert (spec.batch, spec.m, spec.n, spec.k) == (1, 16, 27, 4 * 8 * 8) and spec.conv_t is not None
        assert not [it for it in plan.items if it.out.op == "im2col"]
    else:
        assert (spec.batch, spec.m, spec.n, spec.k) == (1, 27, 16, 4 * 8 * 8)
    assert not [it for it in plan.items if it.kind == "reduce"]
