"""Reading values before or after `backward()`: the plan that computes them then starts from buffers that another
plan realized, whose autograd nodes keep their recorded sources. A max-pool's window maxima realized by the forward
plan used to be scheduled again as an "elementwise" kernel of the backward plan (an internal error) when batch norm
fed the pool; a convolution's output read after backward used to gather from the image past its realized patch
columns (a KeyError)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn as nn
from tests.conftest import DEVICES
from tests.helpers import assert_close


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_after_reading_the_loss_match_torch(device: str) -> None:
    torch.manual_seed(0)
    t = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 4 * 4, 5),
    )
    p = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 4 * 4, 5),
    ).to(device)
    p.load_state_dict(t.state_dict())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = (np.arange(4) % 5).astype(np.int64)

    loss = nn.functional.cross_entropy(p(plait.tensor(x, device=device)), plait.tensor(y, device=device))
    got_loss = loss.item()  # the forward pass runs here, before backward
    loss.backward()
    want = torch.nn.functional.cross_entropy(t(torch.from_numpy(x)), torch.from_numpy(y))
    want.backward()

    assert abs(got_loss - want.item()) <= 1e-5 * max(1.0, abs(want.item()))
    grads = dict(t.named_parameters())
    for name, param in p.named_parameters():
        assert param.grad is not None, name
        assert_close(param.grad.numpy(), grads[name].grad.numpy(), "float32", f"{name}.grad on {device}", tol_scale=10)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("groups", [1, 2])
def test_convolution_output_read_after_backward_matches_torch(device: str, groups: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 6, 8, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6 // groups, 3, 3)).astype(np.float32)
    px = plait.Tensor.from_numpy(x, device=device, requires_grad=True)
    pw = plait.Tensor.from_numpy(w, device=device, requires_grad=True)
    y = nn.functional.conv2d(px, pw, None, 1, 2, 2, groups)
    (y * 2.0).sum().backward()
    tx, tw = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
    want = torch.nn.functional.conv2d(tx, tw, None, 1, 2, 2, groups)
    (want * 2.0).sum().backward()
    assert_close(y.numpy(), want.detach().numpy(), "float32", f"output after backward on {device}", tol_scale=10)
    assert_close(pw.grad.numpy(), tw.grad.numpy(), "float32", f"weight grad on {device}", tol_scale=10)
    assert_close(px.grad.numpy(), tx.grad.numpy(), "float32", f"input grad on {device}", tol_scale=10)
