"""Gradients through many slices of one tensor (an unrolled RNN's time steps, a matmul's gates): contributions that
are disjoint slabs along one axis are joined with a cat; overlapping ones, gaps and slices of slices still sum right."""

from __future__ import annotations

import numpy as np
import torch

import plait
from plait.graph import autodiff
from plait.graph.ops import elementwise as ew
from plait.graph.ops import movement as mv


def _grad(fn, x: np.ndarray, device: str) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    px = plait.tensor(x, device=device, requires_grad=True)
    fn(px).backward()
    tx = torch.tensor(x, requires_grad=True)
    fn(tx).backward()
    assert px.grad is not None and tx.grad is not None
    return px.grad.numpy(), tx.grad.numpy()


def test_time_steps_and_gates(device: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 3, 6)).astype(np.float32)

    def fn(t):  # type: ignore[no-untyped-def]
        h = t[0][:, :2] * 0
        for s in range(7):  # every step reads three gate slices of its own time slice
            a, b, c = t[s][:, :2], t[s][:, 2:4], t[s][:, 4:]
            h = (a + h).tanh() * b.sigmoid() + c
        return (h * h).sum()

    got, want = _grad(fn, x, device)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_gaps_overlaps_and_repeats(device: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((10, 4)).astype(np.float32)

    def fn(t):  # type: ignore[no-untyped-def]
        # rows 0-1 and 6-9 read once, rows 3-4 twice (overlapping slices), row 2 and 5 never (gaps)
        return (t[0:2] * 2).sum() + (t[3:5] ** 2).sum() + (t[4:5] * 3).sum() + (t[6:] * t[6:]).sum() + t[3].sum()

    got, want = _grad(fn, x, device)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_disjoint_slabs_become_one_cat(device: str) -> None:
    """Four disjoint padded slabs along axis 1 with a gap: one cat (zeros in the gap) plus nothing else."""
    g = [ew.const(float(i + 1), (2, 1, 3), plait.dtypes.float32, device) for i in range(3)]
    slabs = [mv.pad(g[0], ((0, 0), (0, 4), (0, 0))), mv.pad(g[1], ((0, 0), (2, 2), (0, 0))),
             mv.pad(g[2], ((0, 0), (4, 0), (0, 0)))]  # fmt: skip
    total = autodiff.accumulate(slabs)
    assert total.op == "cat" and total.shape == (2, 5, 3)
    out = plait.Tensor(total).numpy()
    np.testing.assert_array_equal(out[0, :, 0], [1, 0, 2, 0, 3])


def test_cat_of_many_uneven_parts(device: str) -> None:
    """A cat's kernel finds each element's source by bisection: parts of uneven sizes, 1 to 5 rows each."""
    rng = np.random.default_rng(2)
    parts = [rng.standard_normal((1 + i % 5, 3)).astype(np.float32) for i in range(13)]
    got = plait.cat([plait.tensor(p, device=device) * 2 for p in parts], 0).numpy()
    np.testing.assert_array_equal(got, np.concatenate(parts, 0) * 2)


def test_many_part_cat_loops_without_simd() -> None:
    """The C kernel of a cat of many parts branches per element (a vectorised loop would evaluate every part under a
    mask); a cat of two keeps its vectorised loop."""
    from plait.runtime import get_device
    from plait.schedule.plan import Plan

    def source(parts: int) -> str:
        t = plait.cat([plait.tensor(np.full((2, 3), i, np.float32), device="cpu") for i in range(parts)], 0)
        plan = Plan([t.node])
        assert plan.device is get_device("cpu")
        plan.run()
        np.testing.assert_array_equal(plan(*[])[0][:, 0], np.repeat(np.arange(parts, dtype=np.float32), 2))
        return "\n".join(k.source for k in plan.kernels)

    assert "simd" not in source(20)
    assert "simd" in source(2)
