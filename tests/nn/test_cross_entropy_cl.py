"""Cross-entropy of (N, C) logits at class targets on OpenCL (nn.functional._class_cross_entropy: stacked row sums
and a one-kernel gradient) against PyTorch, ignored targets included, and the few kernels it schedules into."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait import dtypes
from plait.graph import autodiff
from plait.schedule.scheduler import schedule
from tests.conftest import DEVICES


def _data(ignored: bool) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 37), dtype=np.float32) * 4
    t = rng.integers(0, 37, size=6)
    if ignored:
        t[[1, 4]] = -100
    return x, t


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ignored", [False, True])
@pytest.mark.parametrize("target_dtype", [np.int64, np.int32])
def test_cross_entropy_matches_torch(device: str, ignored: bool, target_dtype: type) -> None:
    x, t = _data(ignored)
    px = plait.tensor(x, device=device).requires_grad_(True)
    loss = F.cross_entropy(px, plait.tensor(t.astype(target_dtype), device=device))
    loss.backward()
    tx = torch.from_numpy(x).requires_grad_(True)
    ref = torch.nn.functional.cross_entropy(tx, torch.from_numpy(t))
    ref.backward()
    assert tx.grad is not None and px.grad is not None
    np.testing.assert_allclose(float(loss.item()), float(ref.detach()), rtol=1e-5)
    np.testing.assert_allclose(px.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_cross_entropy_schedules_few_kernels() -> None:
    """Schedule only, as OpenCL builds it (256-way reductions): the loss and the logits' gradient are 4 launches (op
    by op: 10): the row maximum, the stacked row sums, the loss sums, and one kernel writing the gradient and the
    loss."""
    x, t = _data(True)
    px = plait.Tensor.from_numpy(x, device="opencl:0", requires_grad=True)
    loss = F.cross_entropy(px, plait.Tensor.from_numpy(t, device="opencl:0"))
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="opencl:0").node
    g = autodiff.gradients(loss.node, seed, [px.node])[px.node.uid]
    assert g.dtype == dtypes.float32
    items = [it for it in schedule([loss.node, g], 256) if it.kind not in ("alias", "written")]
    assert [it.kind for it in items] == ["reduce", "reduce", "reduce", "elementwise"]
    assert items[-1].out is g and items[-1].extra["writes"] == [loss.node]
