"""Direct depthwise-convolution gradients on OpenCL (plait/graph/ops/depthwise_cl.py): the weight gradient as one
kernel over dy and x, the strided input gradient as one gather, against PyTorch; the training step's depthwise
layer then makes no patch columns. The cpu keeps the column form (tests/nn/test_conv_training.py covers it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.errors import PlaitError
from plait.graph import autodiff
from plait.graph.ops.conv import Window
from plait.graph.ops.depthwise_cl import depthwise_dgrad_cl, depthwise_wgrad_cl
from plait.schedule.plan import Plan
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]

CASES = [  # x shape, kernel, conv2d keyword arguments
    ((2, 3, 9, 9), (3, 3), {"padding": 1}),
    ((3, 4, 8, 7), (3, 3), {"stride": 2, "padding": 1}),
    ((2, 2, 11, 10), (3, 2), {"stride": (2, 1), "padding": (0, 1), "dilation": (2, 1)}),
    ((1, 3, 10, 13), (5, 5), {"stride": 2, "padding": 2}),
    ((2, 2, 6, 5), (3, 3), {"padding": (2, 3), "dilation": 2}),
    ((40, 2, 16, 16), (3, 3), {"padding": 1}),  # positions enough for several parts per channel
]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{sorted(c[2].items())}" for c in CASES])
def test_depthwise_training_gradients_match_torch(device: str, case: tuple) -> None:
    xs, (kh, kw), kwargs = case
    c = xs[1]
    xa, wa = rand(xs, seed=1), rand((c, 1, kh, kw), seed=2)
    x = plait.tensor(xa, device=device, requires_grad=True)
    w = plait.tensor(wa, device=device, requires_grad=True)
    xt, wt = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
    out = F.conv2d(x, w, groups=c, **kwargs)
    ref = torch.nn.functional.conv2d(xt, wt, groups=c, **kwargs)
    assert_close(out.numpy(), ref.detach().numpy(), "float32", "depthwise forward (training form)")
    ga = rand(tuple(ref.shape), seed=3)
    (out * plait.tensor(ga, device=device)).sum().backward()
    (ref * torch.tensor(ga)).sum().backward()
    assert x.grad is not None and w.grad is not None
    assert_close(x.grad.numpy(), xt.grad.numpy(), "float32", "depthwise input gradient")
    assert_close(w.grad.numpy(), wt.grad.numpy(), "float32", "depthwise weight gradient", tol_scale=10.0)


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise_training_step_has_no_patch_columns(device: str, stride: int) -> None:
    """The depthwise layer's forward gathers its patches from the image (no im2col buffer), its weight gradient
    is the direct kernel plus the sum of its parts, and a strided input gradient is the direct gather (no col2im)."""
    x = plait.tensor(rand((64, 4, 16, 16), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((4, 1, 3, 3), seed=2), device=device, requires_grad=True)
    y = F.conv2d(x, w, stride=stride, padding=1, groups=4)
    loss = (y * y).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    grads = autodiff.gradients(loss.node, seed, [x.node, w.node])
    plan = Plan([y.node, grads[x.node.uid], grads[w.node.uid]])
    ops = [it.out.op for it in plan.items]
    assert "im2col" not in ops and "col2im" not in ops, ops
    assert ops.count("depthwise_wgrad_cl") == 1, ops
    assert ops.count("depthwise_dgrad_cl") == (stride > 1), ops


def test_depthwise_direct_ops_reject_bad_shapes() -> None:
    win = Window(2, 3, 8, 8, 3, 3, 1, 1, 1, 1)
    dy = plait.tensor(rand((2, 3, 7, 7)), device="cpu").node
    x = plait.tensor(rand((2, 3, 8, 8)), device="cpu").node
    with pytest.raises(PlaitError, match="depthwise_wgrad_cl: output gradient of shape"):
        depthwise_wgrad_cl(dy, x, win)
    with pytest.raises(PlaitError, match="depthwise_dgrad_cl: weight of shape"):
        depthwise_dgrad_cl(plait.tensor(rand((2, 3, 8, 8)), device="cpu").node, x, win)
    big = Window(2, 3, 8, 8, 7, 7, 1, 1, 3, 3)
    with pytest.raises(PlaitError, match="exceed 25 taps"):
        depthwise_wgrad_cl(plait.tensor(rand((2, 3, 8, 8)), device="cpu").node, x, big)
