"""Where a `cpu` team run waits (plait/runtime/cpu_team.py `team_barriers`, the team's own spin-then-futex barrier from
plait/codegen/c.py TEAM_SYNC): no barrier between steps that do not depend on each other, one wherever a step reads
what the steps since the last barrier write, overwrites what they read or write, or shares the run's cell with one
of them. Results must be those of the same kernels launched one by one and of PyTorch, on one thread and on two,
whether the waiting thread spins or sleeps at once; a plan's peak counts the team's shared buffer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

import plait
from plait.codegen.cstyle import RenderedKernel
from plait.runtime import get_device
from plait.runtime.base import Buffer
from plait.runtime.cpu_team import TeamRun, team_barriers
from plait.schedule.plan import Plan, read, run_launches


def _teams(plan: Plan) -> list[TeamRun]:
    return [r for r in plan.replay if isinstance(r, TeamRun)]


def _team_and_alone(plan: Plan, *arrays: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every output from the plan's team runs, then from its kernels launched one by one (outputs poisoned first)."""
    bufs = [plan.buffers[o.uid] for o in plan.outputs]

    def poison() -> None:
        for o, b in zip(plan.outputs, bufs, strict=True):
            plan.device.allocator.copy_in(b, np.full(o.shape, np.nan, o.dtype.np))

    poison()
    team = plan(*arrays)
    poison()
    run_launches(plan.device, plan.launches)
    return team, [read(plan.device, b, o) for o, b in zip(plan.outputs, bufs, strict=True)]


def test_independent_reductions_share_no_barrier(threads: int) -> None:
    """Two reductions of the same input (each followed by a sum of its result) run back to back: the second
    reduction reads only the input, so it needs no barrier after the first one's sum; the results are the
    kernel-by-kernel ones and PyTorch's."""
    x = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)

    def fn(t: plait.Tensor) -> tuple[plait.Tensor, plait.Tensor, plait.Tensor]:
        a = (t * 2.0).exp().sum(axis=1)
        b = t.tanh().max(axis=0)
        return a.sum() + b.sum(), a, b

    plan, _ = plait.jit(fn, device="cpu").plan_for([x])
    (team,) = _teams(plan)
    assert len(plan.replay) == 1 and len(team.sync) == len(plan.launches) == 5
    assert list(team.sync).count(0) == 2  # the first step, and the second reduction after the first one's sum
    got, alone = _team_and_alone(plan, x)
    for g, w in zip(got, alone, strict=True):
        np.testing.assert_array_equal(g, w)
    t = torch.tensor(x, dtype=torch.float64)
    a, b = torch.exp(t * 2.0).sum(dim=1), torch.tanh(t).amax(dim=0)
    for g, w in zip(got, [a.sum() + b.sum(), a, b], strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=2e-5, atol=2e-4)


def test_sleeping_barrier_gives_the_same_results(threads: int) -> None:
    """With no spin (every waiting thread sleeps on the futex at once) a product with a shared packing of B (the
    GEMM's internal barrier) between elementwise kernels, replayed many times, matches the kernel-by-kernel run
    bit for bit and PyTorch; the team run's shared buffer counts in the plan's peak."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 300)).astype(np.float32)
    b = rng.standard_normal((300, 48)).astype(np.float32)
    plan, _ = plait.jit(lambda x, y: ((x * 0.5).exp() @ y).tanh() + 1.0, device="cpu").plan_for([a, b])
    (team,) = _teams(plan)
    _, (want,) = _team_and_alone(plan, a, b)
    for spin in (0, 1_000_000):
        team.cell.spin = spin
        for _ in range(20):
            np.testing.assert_array_equal(plan(a, b)[0], want)
    ref = torch.tanh(torch.exp(torch.tensor(a, dtype=torch.float64) * 0.5) @ torch.tensor(b, dtype=torch.float64))
    np.testing.assert_allclose(want, ref.numpy() + 1.0, rtol=2e-5, atol=2e-4)
    if threads == 2:  # the 256 rows split between the threads share one packing of all of B
        assert team.shared_bytes >= b.nbytes
    assert plan.scratch_bytes == team.shared_bytes
    assert plan.peak_bytes >= plan.scratch_bytes + a.nbytes + b.nbytes + 4 * 256 * 48


def _buf(arr: np.ndarray) -> Buffer:
    return Buffer(get_device("cpu"), arr.nbytes, arr)


def _step(out: list[Buffer], ins: list[Buffer], cell: bool = False, source: str = "") -> SimpleNamespace:
    """A launch of a kernel `k` writing `out` and reading `ins` (default signature: outputs first, inputs const)."""
    params = [f"float* restrict o{i}" for i in range(len(out))] + [
        f"const float* restrict a{i}" for i in range(len(ins))
    ]
    kernel = RenderedKernel("k", source or f"void k({', '.join(params)}) {{}}", (1,), None, writes=len(out))
    return SimpleNamespace(program=SimpleNamespace(cell=cell), kernel=kernel, buffers=[*out, *ins])


def test_barriers_follow_reads_writes_overlaps_and_the_cell() -> None:
    """Read after write, write after read and write after write on overlapping memory (two views of one block, as
    the memory plan's tenants of a slot are) each need a barrier; reads of the same buffer do not; two steps using
    the run's cell always do; a pointer parameter not declared const counts as written."""
    block = np.zeros(64, np.uint8)
    x, y, z, w, v = (_buf(np.zeros(16, np.uint8)) for _ in range(5))
    lo, hi, mid = _buf(block[:32]), _buf(block[32:]), _buf(block[24:40])
    steps = [
        _step([lo], [x]),
        _step([hi], [x]),  # reads x as the first does, writes the memory next to the first's: no barrier
        _step([y], [mid]),  # reads what both wrote
        _step([z], [x]),  # after that barrier only the third step is in flight
        _step([x], [w]),  # overwrites x, which the step before reads
        _step([w], [y], cell=True),  # overwrites w, which the step before reads
        _step([z], [x]),  # neither touches what the step before writes or reads
        _step([v], [lo], cell=True),  # independent of both, but a second user of the cell
    ]
    assert team_barriers(steps) == [0, 0, 1, 0, 1, 1, 0, 1]
    # the second argument is written through a pointer the signature does not declare const
    source = "void k(float* restrict o, float* restrict acc, const float* restrict a) {}"
    assert team_barriers([_step([y], [z, x], source=source), _step([w], [z])]) == [0, 1]
    const = "void k(float* restrict o, const float* restrict acc, const float* restrict a) {}"
    assert team_barriers([_step([y], [z, x], source=const), _step([w], [z])]) == [0, 0]
    assert team_barriers([_step([w], [x], cell=True), _step([y], [z], cell=True)]) == [0, 1]
    # a signature that cannot be read: every argument counts as written
    assert team_barriers([_step([y], [x], source="void other() {}"), _step([w], [x])]) == [0, 1]
