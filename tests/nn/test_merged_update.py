"""On OpenCL, outputs of the same size that no later kernel reads (an optimizer's updates, batch norm's running
statistics) are written by one kernel (scheduler._merge_final_writes): the updates of a compiled training step,
replayed, must still match PyTorch's optimizers step by step."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.schedule.scheduler import schedule
from tests.conftest import DEVICES


class _Torch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(
            3, 8, 3, padding=1, bias=False
        )  # a bias before batch norm gets ~0 gradients: Adam would scale up their noise
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean((2, 3)))


class _Plait(plait.nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.conv = plait.nn.Conv2d(3, 8, 3, padding=1, bias=False, device=device)
        self.bn1 = plait.nn.BatchNorm2d(8, device=device)
        self.conv2 = plait.nn.Conv2d(8, 8, 3, padding=1, bias=False, device=device)
        self.bn2 = plait.nn.BatchNorm2d(8, device=device)
        self.fc = plait.nn.Linear(8, 5, device=device)

    def forward(self, x: plait.Tensor) -> plait.Tensor:
        x = F.relu(self.bn1(self.conv(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(axis=(2, 3)))


def test_small_final_outputs_share_one_kernel() -> None:
    """Updates of 8, 8, 16 and 8 values on a device splitting 256 ways: small outputs merge whatever their sizes,
    so all four become one kernel writing four buffers (three 'written' items before it); the cpu's schedule keeps
    one kernel each."""
    ps = [plait.tensor(np.ones(n, np.float32)) for n in (8, 8, 16, 8)]
    gs = [plait.tensor(np.full(n, 0.5, np.float32)) for n in (8, 8, 16, 8)]
    outs = [(p - g * 0.1).node for p, g in zip(ps, gs, strict=True)]
    items = schedule(outs, 256)
    assert [it.kind for it in items] == ["written", "written", "written", "elementwise"]
    merged = items[-1]
    assert merged.extra["writes"] == outs[:3] and merged.out is outs[3]
    assert [it.kind for it in schedule(outs, 16)] == ["elementwise"] * 4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_compiled_step_updates_match_torch(device: str, opt: str) -> None:
    torch.manual_seed(0)
    ref = _Torch()
    model = _Plait(device)
    model.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    topt: Any
    if opt == "sgd":
        topt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        popt: Any = plait.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    else:
        topt = torch.optim.Adam(ref.parameters(), lr=0.01)
        popt = plait.optim.Adam(model.parameters(), lr=0.01)

    def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        loss = plait.nn.CrossEntropyLoss()(model(x), y)
        popt.zero_grad()
        loss.backward()
        popt.step()
        return loss

    compiled = plait.compile_step(step)
    rng = np.random.default_rng(1)
    for _ in range(4):  # eager, two traced calls, then a replay
        xs = rng.standard_normal((4, 3, 6, 6)).astype(np.float32)
        ys = rng.integers(0, 5, 4)
        loss = torch.nn.functional.cross_entropy(ref(torch.tensor(xs)), torch.tensor(ys))
        topt.zero_grad()
        loss.backward()
        topt.step()
        got = compiled(plait.tensor(xs, device=device), plait.tensor(ys, device=device))
        np.testing.assert_allclose(got.numpy(), loss.item(), rtol=1e-4, atol=1e-5)
    have = model.state_dict()
    for name, want in ref.state_dict().items():
        np.testing.assert_allclose(np.asarray(have[name].numpy()), want.numpy(), rtol=2e-4, atol=2e-5, err_msg=name)
