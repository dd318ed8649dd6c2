"""Plan memory: intermediates share storage once their last reader has run (plait/schedule/plan.py, plan_memory),
with the same results as buffers of their own, and values a caller can still read keep theirs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn as nn
from plait import settings
from plait.dtypes import float32
from plait.graph.node import Node, toposort
from plait.runtime import get_device
from plait.schedule.plan import Plan, Tenant, plan_memory
from plait.schedule.profile import profile_plan
from tests.helpers import rand


def test_a_chain_reuses_slots_once_their_reader_ran() -> None:
    # five 100-byte steps, each read by the next: two slots carry the chain, the pinned last step has its own buffer
    mem = plan_memory([100] * 5, [None] * 5, [[], [0], [1], [2], [3]], {4})
    assert mem.slot[4] is None
    assert sum(mem.sizes) == 200
    for i in range(1, 4):
        assert mem.slot[i] != mem.slot[i - 1]  # never written over the input it reads


def test_views_extend_their_roots_lifetime_and_pinned_roots_stay() -> None:
    # step 1 views step 0, step 3 reads the view: step 2 may not take step 0's slot
    mem = plan_memory([100, 100, 100, 100], [None, 0, None, None], [[], [], [], [1]], {3})
    assert mem.slot[1] is None and mem.slot[2] != mem.slot[0]
    # a pinned view keeps its root out of the slots
    mem = plan_memory([100, 100, 100], [None, 0, None], [[], [], [1]], {1})
    assert mem.slot[0] is None


def test_a_free_slot_grows_rather_than_a_new_one() -> None:
    mem = plan_memory([100, 100, 300, 8], [None] * 4, [[], [0], [1], [2]], {3})
    assert len(mem.sizes) == 2 and sorted(mem.sizes) == [100, 300]


def _graph(x: plait.Tensor, w: plait.Tensor) -> list[plait.Tensor]:
    """Products and reductions that each need a buffer: a chain whose intermediates can share storage."""
    h = x
    for _ in range(4):
        h = (h @ w).relu() + 0.5
        h = h - h.mean(axis=1, keepdims=True)
    return [h.sum(axis=0), (h * h).max(axis=1)]


def _plan(device: str, reuse: bool) -> tuple[Plan, list[np.ndarray]]:
    xs, ws = rand((16, 24), seed=1), rand((24, 24), seed=2) * 0.3
    inputs = [Node("input", (), None, a.shape, float32, device) for a in (xs, ws)]
    outs = _graph(plait.Tensor(inputs[0]), plait.Tensor(inputs[1]))
    plan = Plan([o.node for o in outs], inputs, reuse=reuse)
    return plan, plan(xs, ws)


def test_results_are_identical_with_and_without_reuse(device: str) -> None:
    shared, got = _plan(device, True)
    own, want = _plan(device, False)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    assert any(isinstance(b, Tenant) for b in shared.buffers.values())
    assert shared.peak_bytes < own.peak_bytes == own.unshared_bytes
    # a second replay of the shared plan (fixed buffers, bound once) gives the same again
    xs, ws = rand((16, 24), seed=1), rand((24, 24), seed=2) * 0.3
    for g, w in zip(shared(xs, ws), want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_a_chain_peaks_below_the_sum_of_its_intermediates() -> None:
    xs, ws = rand((32, 32), seed=3), rand((32, 32), seed=4) * 0.2
    inputs = [Node("input", (), None, a.shape, float32, "cpu") for a in (xs, ws)]
    h, w = plait.Tensor(inputs[0]), plait.Tensor(inputs[1])
    for _ in range(8):
        h = (h @ w).tanh()  # each product is a buffer read only by the next
    plan = Plan([h.node], inputs)
    ref = xs
    for _ in range(8):
        ref = np.tanh(ref @ ws)
    np.testing.assert_allclose(plan(xs, ws)[0], ref, rtol=1e-5, atol=1e-6)
    block = 32 * 32 * 4
    # inputs and output own their buffers; the seven intermediates fit in two slots; the team run keeps one packed
    # 32x32 operand where its products split their rows between threads
    extra = plan.scratch_bytes
    assert extra in (0, block)
    assert plan.unshared_bytes == 10 * block + extra
    assert plan.peak_bytes == 5 * block + extra
    report = profile_plan(plan, reps=1)  # the kernel report shows the peak too
    assert (report.memory_bytes, report.unshared_bytes) == (5 * block + extra, 10 * block + extra)
    assert f"peak {(5 * block + extra) / 2**20:.1f} MB in the plans' buffers" in str(report)


def test_values_a_tensor_holds_are_kept_and_others_recomputed() -> None:
    x, w = plait.tensor(rand((8, 8), seed=5)), plait.tensor(rand((8, 8), seed=6))
    kept = (x @ w).relu()
    out = ((kept @ w).tanh() @ w).sum()
    out.realize()
    assert kept.node.buffer is not None and not isinstance(kept.node.buffer, Tenant)
    xn, wn = x.numpy(), w.numpy()
    k = np.maximum(xn @ wn, 0)
    # float32 sums of eight products that cancel (an entry of 0.0106 from terms near 1): an absolute bound too, since
    # NumPy's BLAS and plait may add them in different orders (1.1e-7 apart on an AMD EPYC host)
    np.testing.assert_allclose(kept.numpy(), k, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.numpy(), (np.tanh(k @ wn) @ wn).sum(), rtol=1e-4)


def _loss(x: plait.Tensor, w: plait.Tensor) -> plait.Tensor:
    return ((x @ w).relu() @ w).tanh().sum()  # the product and its relu are only the loss's (a Tensor dies here)


def test_a_loss_read_before_backward_keeps_what_backward_reads() -> None:
    xs, ws = rand((6, 6), seed=7), rand((6, 6), seed=8)
    x, w = plait.tensor(xs), plait.tensor(ws, requires_grad=True)
    loss = _loss(x, w)
    loss.realize()
    # the relu and the second product are buffers of the loss's plan, saved for backward rather than reused
    saved = {n.op for n in toposort([loss.node], through_realized=True) if n.srcs and n.buffer is not None}
    assert {"relu", "matmul"} <= saved
    loss.backward()
    wt = torch.tensor(ws, requires_grad=True)
    ref = (torch.relu(torch.tensor(xs) @ wt) @ wt).tanh().sum()
    ref.backward()
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-5)
    assert w.grad is not None and wt.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), wt.grad.numpy(), rtol=1e-4, atol=1e-6)


def _net() -> tuple[nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    t = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 4 * 4, 5),
    )
    p = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 5),
    )
    p.load_state_dict(t.state_dict())
    return p, t


def _train(loss_first: bool) -> int:
    """Four steps against PyTorch's (eager, two traced, one replayed; or eager with the loss read before backward,
    which keeps the forward values backward reads); returns the peak bytes the steps held."""
    p, t = _net()
    po = plait.optim.SGD(p.parameters(), lr=0.05, momentum=0.9)
    to = torch.optim.SGD(t.parameters(), lr=0.05, momentum=0.9)

    def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        po.zero_grad()
        loss = nn.functional.cross_entropy(p(x), y)
        if loss_first:
            loss.realize()
        loss.backward()
        po.step()
        return loss

    run = step if loss_first else plait.compile_step(step, device="cpu")
    alloc = get_device("cpu").allocator
    alloc.reset_peak()
    base = alloc.in_use
    rng = np.random.default_rng(2)
    for _ in range(4):
        xs, ys = rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, 4)
        got = float(run(plait.tensor(xs), plait.tensor(ys)).numpy())
        to.zero_grad()
        ref = torch.nn.functional.cross_entropy(t(torch.from_numpy(xs)), torch.from_numpy(ys))
        ref.backward()
        to.step()
        np.testing.assert_allclose(got, ref.item(), rtol=1e-5)
    sd = t.state_dict()
    for k, v in p.state_dict().items():
        np.testing.assert_allclose(v.numpy(), sd[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)
    return alloc.peak - base


@pytest.mark.parametrize("loss_first", [False, True], ids=["compiled-step", "loss-read-before-backward"])
def test_training_a_conv_net_with_reuse_matches_torch(loss_first: bool) -> None:
    with settings.override(PLAIT_REUSE_BUFFERS=1):
        shared = _train(loss_first)
    with settings.override(PLAIT_REUSE_BUFFERS=0):
        own = _train(loss_first)
    assert shared < own
