"""Compile a torch module with the plait backend and compare it with eager PyTorch."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from plait.frontends.torch.partition import PlaitFallbackWarning


def compile_plait(model: Any, device: str) -> Any:
    return torch.compile(model, backend="plait", options={"device": device})


def run_no_fallback(fn: Any, *args: Any) -> Any:
    """Call fn, failing the test if any part of the graph fell back to PyTorch."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlaitFallbackWarning)
        return fn(*args)


def assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-4, what: str = "") -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=rtol, atol=atol, err_msg=what)
