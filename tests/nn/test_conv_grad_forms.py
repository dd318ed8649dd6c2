"""The convolution gradient forms `nn.functional._conv_vjp` picks (a stride-1 input gradient as a transposed
convolution, the folded weight gradient as (columns @ dy^T)^T, only one of the two inputs needing a gradient)
against PyTorch on every available device, and the kernels they leave in a backward plan."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand

CASES = [  # x shape, weight shape, conv2d keyword arguments: every one stride 1 (transposed input gradient)
    ((2, 4, 7, 9), (16, 4, 3, 3), {}),  # no padding: the transposed convolution pads by 2
    ((2, 4, 9, 7), (16, 4, 3, 3), {"padding": 2}),  # padding = k - 1: the transposed convolution pads by 0
    ((1, 6, 8, 8), (32, 3, 3, 3), {"padding": 2, "dilation": 2, "groups": 2}),
    ((2, 8, 6, 6), (8, 1, 3, 3), {"padding": 1, "groups": 8}),  # depthwise: the per-image form
    ((2, 4, 8, 8), (4, 4, 5, 3), {"padding": (2, 1)}),
    ((2, 4, 8, 8), (8, 1, 3, 3), {"padding": 1, "groups": 4}),  # two output channels per input channel
]
DEPTHWISE = [  # the per-image form with strides (col2im) and dilation
    ((2, 8, 7, 7), (8, 1, 3, 3), {"stride": 2, "padding": 1, "groups": 8}),
    ((2, 6, 9, 9), (6, 1, 3, 3), {"stride": 2, "dilation": 2, "groups": 6}),
]


def _check(device: str, xs: tuple, ws: tuple, kw: dict, x_grad: bool, w_grad: bool) -> None:
    xa, wa = rand(xs, seed=1), rand(ws, seed=2)
    x = plait.tensor(xa, device=device, requires_grad=x_grad)
    w = plait.tensor(wa, device=device, requires_grad=w_grad)
    xt, wt = torch.tensor(xa, requires_grad=x_grad), torch.tensor(wa, requires_grad=w_grad)
    out, ref = F.conv2d(x, w, **kw), torch.nn.functional.conv2d(xt, wt, **kw)
    assert_close(out.numpy(), ref.detach().numpy(), "float32", "conv2d forward")
    ga = rand(tuple(ref.shape), seed=4)
    (out * plait.tensor(ga, device=device)).sum().backward()
    (ref * torch.tensor(ga)).sum().backward()
    if x_grad:
        assert x.grad is not None
        assert_close(x.grad.numpy(), xt.grad.numpy(), "float32", "conv2d input gradient")
    if w_grad:
        assert w.grad is not None
        assert_close(w.grad.numpy(), wt.grad.numpy(), "float32", "conv2d weight gradient")


@pytest.mark.parametrize("case", CASES, ids=[f"{c[1]}-{sorted(c[2].items())}" for c in CASES])
def test_stride1_gradients_match_torch(device: str, case: tuple) -> None:
    _check(device, *case, x_grad=True, w_grad=True)


@pytest.mark.parametrize("case", DEPTHWISE, ids=[f"{c[1]}-{sorted(c[2].items())}" for c in DEPTHWISE])
def test_depthwise_gradients_match_torch(device: str, case: tuple) -> None:
    _check(device, *case, x_grad=True, w_grad=True)


def test_depthwise_input_gradient_is_a_depthwise_convolution() -> None:
    """A stride-1 depthwise convolution's input gradient gathers from the output gradient (an implicit depthwise
    convolution with the flipped weight) instead of a product per tap and a col2im; on the cpu its weight gradient
    is one kernel reading the input in place (plait/graph/ops/depthwise_grad_c.py), so the forward gathers from the
    image too: no patch columns at all."""
    x = plait.tensor(rand((2, 8, 10, 10), seed=1), device="cpu", requires_grad=True)
    w = plait.tensor(rand((8, 1, 3, 3), seed=2), device="cpu", requires_grad=True)
    loss = (F.conv2d(x, w, padding=1, groups=8) * plait.tensor(rand((2, 8, 10, 10), seed=3))).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
    grads = autodiff.gradients(loss.node, seed, [x.node, w.node])
    items = Plan([loss.node, grads[x.node.uid], grads[w.node.uid]]).items
    assert [it.out.op for it in items if it.out.op in ("im2col", "col2im", "depthwise_wgrad_c")] == [
        "depthwise_wgrad_c"
    ]
    assert sum(it.gemm is not None and it.gemm.conv is not None for it in items) == 2


@pytest.mark.parametrize(("x_grad", "w_grad"), [(False, True), (True, False)], ids=["weight-only", "input-only"])
def test_one_input_needing_a_gradient_matches_torch(device: str, x_grad: bool, w_grad: bool) -> None:
    _check(device, (2, 4, 8, 8), (16, 4, 3, 3), {"padding": 1}, x_grad, w_grad)
    _check(device, (2, 4, 9, 9), (16, 4, 3, 3), {"stride": 2, "padding": 1}, x_grad, w_grad)


def test_stride1_input_gradient_is_a_convolution_without_col2im() -> None:
    """The input gradient of a 3x3 stride-1 convolution is one implicit-GEMM convolution of the output gradient
    (no patch-column gradient, no col2im); a stride-2 one keeps the columns' gradient and col2im."""
    for stride, col2im in ((1, 0), (2, 1)):
        x = plait.tensor(rand((2, 8, 8, 8), seed=1), device="cpu", requires_grad=True)
        w = plait.tensor(rand((16, 8, 3, 3), seed=2), device="cpu", requires_grad=True)
        loss = F.conv2d(x, w, stride=stride, padding=1).sum()
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
        grads = autodiff.gradients(loss.node, seed, [x.node])
        items = Plan([grads[x.node.uid]]).items
        assert sum(it.out.op == "col2im" for it in items) == col2im
        if stride == 1:
            convs = [it.gemm for it in items if it.gemm is not None and it.gemm.conv is not None]
            assert len(convs) == 1 and (convs[0].m, convs[0].k) == (8, 16 * 9)
