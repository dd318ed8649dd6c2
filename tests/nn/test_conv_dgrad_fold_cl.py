"""Stride-1 convolution input gradients on OpenCL with fewer than 128 channels (nn.functional FOLD_DGRAD_MAX_CHANNELS)
run as one product with the batch folded into its columns, as the training forward does: against PyTorch, and the
product's shape shows the fold (C_in rows over images x positions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.graph.node import toposort
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]

CASES = [  # x shape, weight shape, conv2d keyword arguments
    ((2, 16, 9, 9), (24, 16, 3, 3), {"padding": 1}),
    ((3, 16, 8, 7), (20, 16, 5, 5), {"padding": 2}),
    ((2, 16, 10, 9), (16, 16, 3, 2), {"padding": (2, 1), "dilation": (2, 1)}),
]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("case", CASES, ids=["3x3", "5x5", "dilated"])
def test_folded_input_gradient_matches_torch(device: str, case: tuple) -> None:
    xs, ws, kwargs = case
    xa, wa = rand(xs, seed=1), rand(ws, seed=2)
    x = plait.tensor(xa, device=device, requires_grad=True)
    w = plait.tensor(wa, device=device, requires_grad=True)
    xt, wt = torch.tensor(xa, requires_grad=True), torch.tensor(wa, requires_grad=True)
    out, ref = F.conv2d(x, w, **kwargs), torch.nn.functional.conv2d(xt, wt, **kwargs)
    ga = rand(tuple(ref.shape), seed=3)
    seed = plait.tensor(ga, device=device)
    grads = autodiff.gradients(
        (out * seed).sum().node, plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node, [x.node]
    )
    products = [n.shape for n in toposort([grads[x.node.uid]]) if n.op == "matmul"]
    assert (1, xs[1], xs[0] * xs[2] * xs[3]) in products, products
    (out * seed).sum().backward()
    (ref * torch.tensor(ga)).sum().backward()
    assert x.grad is not None and w.grad is not None and xt.grad is not None and wt.grad is not None
    assert_close(x.grad.numpy(), xt.grad.numpy(), "float32", "folded input gradient", tol_scale=4.0)
    assert_close(w.grad.numpy(), wt.grad.numpy(), "float32", "weight gradient", tol_scale=4.0)
