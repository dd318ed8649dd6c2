"""New input shapes: a recompile (static) or one dynamic-batch graph; both give eager's results."""

from __future__ import annotations

import torch

from tests.torch.helpers import assert_close, compile_plait, run_no_fallback


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 5),
    ).eval()


def test_new_shapes_recompile(device: str) -> None:
    net = _net()
    compiled = compile_plait(net, device)
    with torch.no_grad():
        for batch, size in ((1, 8), (3, 8), (2, 10), (5, 12), (1, 8)):
            x = torch.randn(batch, 3, size, size)
            assert_close(run_no_fallback(compiled, x), net(x), what=f"batch {batch}, {size}x{size}")


def test_dynamic_batch_dimension(device: str) -> None:
    net = _net()
    compiled = torch.compile(net, backend="plait", options={"device": device}, dynamic=True)
    with torch.no_grad():
        for batch in (2, 3, 7):
            x = torch.randn(batch, 3, 9, 9)
            assert_close(run_no_fallback(compiled, x), net(x), what=f"dynamic batch {batch}")
