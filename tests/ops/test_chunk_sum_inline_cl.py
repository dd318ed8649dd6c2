"""A split-K product's chunk sum read by one elementwise kernel is added in that kernel (scheduler._chunk_sums_inline,
OpenCLRenderer.render_elementwise): a linear layer's product and the ReLU mask that reads it are one launch, and the
gradients still match PyTorch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
from plait.graph import autodiff
from plait.graph.node import Node
from plait.schedule.scheduler import schedule
from tests.conftest import DEVICES


def _data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64), dtype=np.float32)
    w1 = rng.standard_normal((1024, 64), dtype=np.float32) * 0.1
    b1 = rng.standard_normal(1024, dtype=np.float32) * 0.1
    w2 = rng.standard_normal((256, 1024), dtype=np.float32) * 0.03
    c = rng.standard_normal((16, 256), dtype=np.float32)
    return x, w1, b1, w2, c


def _grads(device: str) -> tuple[list[plait.Tensor], list[Node]]:
    """The gradients of x, w1 and b1 for sum(relu(relu(x @ w1^T + b1) @ w2^T) * c). The second product (K = 1024)
    splits into 4 chunks on a device that splits reductions 256 ways; only its ReLU's mask on `c` reads it."""
    x, w1, b1, w2, c = (plait.tensor(a, device=device) for a in _data())
    for t in (x, w1, b1):
        t.requires_grad_(True)
    loss = (((x @ w1.T + b1).relu() @ w2.T).relu() * c).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    g = autodiff.gradients(loss.node, seed, [t.node for t in (x, w1, b1)])
    return [x, w1, b1], [g[t.node.uid] for t in (x, w1, b1)]


def test_chunk_sum_feeds_its_mask_in_one_kernel() -> None:
    """Schedule only (no device): the mask kernel reads the second product's chunks (no reduce item sums them on
    their own); the cpu's schedule (16 ways) keeps no such kernel."""
    _, outs = _grads("cpu")
    items = schedule(outs, 256, split_k=True)
    fused = [it for it in items if it.extra.get("chunk_sums")]
    assert len(fused) == 1
    (m,) = fused[0].extra["chunk_sums"]
    assert m.srcs[0].shape == (4, 16, 256) and m.srcs[0] in fused[0].inputs
    assert all(it.out is not m for it in items)
    assert not [it for it in schedule(outs, 16) if it.extra.get("chunk_sums")]


@pytest.mark.parametrize("device", DEVICES)
def test_chunk_sum_inline_matches_torch(device: str) -> None:
    """relu(a @ w2^T) * c with a (16, 1024): on OpenCL one kernel sums the product's 4 chunks, applies the ReLU
    and scales by c."""
    _, _, _, w2, c = _data()
    a = np.random.default_rng(1).standard_normal((16, 1024), dtype=np.float32)
    pa, pw, pc = (plait.tensor(v, device=device) for v in (a, w2, c))
    out = (pa @ pw.T).relu() * pc
    items = schedule([out.node], 256, split_k=True)
    assert device == "cpu" or [it for it in items if it.extra.get("chunk_sums")]
    ref = torch.relu(torch.from_numpy(a) @ torch.from_numpy(w2).T) * torch.from_numpy(c)
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-4, atol=1e-5)
