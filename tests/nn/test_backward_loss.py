"""`Tensor.backward` realizes the loss with its gradients: a step that returns its loss after the update returns the
loss the gradients came from (as PyTorch's does), computed once, in the eager step and in a compiled step's replays."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import plait


class _Torch(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class _Plait(plait.nn.Module):
    def __init__(self, device: str) -> None:
        super().__init__()
        self.conv = plait.nn.Conv2d(3, 4, 3, padding=1, device=device)
        self.fc = plait.nn.Linear(4 * 4 * 4, 5, device=device)

    def forward(self, x: Any) -> Any:
        return self.fc(self.conv(x).relu().flatten(1))


def _twins(device: str) -> tuple[_Torch, _Plait]:
    torch.manual_seed(0)
    t = _Torch()
    p = _Plait(device)
    p.load_state_dict({k: v.detach().numpy() for k, v in t.state_dict().items()})
    return t, p


def _data(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    return rng.standard_normal((3, 3, 4, 4), dtype=np.float32), rng.integers(0, 5, size=(3,))


def _torch_losses(model: _Torch, steps: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    out = []
    for s in range(steps):
        x, y = _data(s)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def test_backward_realizes_the_loss(device: str) -> None:
    """After backward the loss holds its buffer, so reading it after the update gives the pre-update loss."""
    t, p = _twins(device)
    opt = plait.optim.SGD(p.parameters(), lr=0.5)
    x, y = _data(0)
    loss = plait.nn.functional.cross_entropy(p(plait.tensor(x, device=device)), plait.tensor(y, device=device))
    loss.backward()
    assert loss.node.realized
    opt.step()
    np.testing.assert_allclose(float(loss.item()), _torch_losses(t, 1)[0], rtol=1e-5)


def test_compiled_step_returns_pre_update_losses(device: str) -> None:
    """The eager, traced and replayed calls of a compiled step each return the loss before their update."""
    t, p = _twins(device)
    opt = plait.optim.SGD(p.parameters(), lr=0.5)

    @plait.compile_step(device=device)
    def step(x: Any, y: Any) -> Any:
        opt.zero_grad()
        loss = plait.nn.functional.cross_entropy(p(x), y)
        loss.backward()
        opt.step()
        return loss

    got = [float(step(*_data(s)).item()) for s in range(5)]
    np.testing.assert_allclose(got, _torch_losses(t, 5), rtol=1e-4, atol=1e-6)
    for (name, tp), pp in zip(t.named_parameters(), p.parameters(), strict=True):
        np.testing.assert_allclose(pp.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
