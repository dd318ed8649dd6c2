"""Long reductions with few outputs on devices that split them 256 ways (OpenCL): each partial is a work-group that
combines its work-items' sums in local memory, checked against NumPy on every device (the cpu splits them its own
way), including NaN through max/min, totals that do not fill the last step, and one partial per output."""

import numpy as np
import pytest

import plait
from plait.schedule.scheduler import schedule
from tests.helpers import assert_close, rand


def _rsplits(node: plait.Tensor, parts: int) -> list[tuple]:
    return [it.out.arg for it in schedule([node.node], parts) if it.out.op == "rsplit"]


def test_wide_devices_split_into_work_groups() -> None:
    """64 channels over 64*56*56 values: 17 work-groups per channel (about 1056 in all), 256 work-items each; 4096
    outputs over 2048 values: one work-group per output and no second stage; the cpu keeps one work-item per
    partial."""
    x = plait.tensor(np.zeros((64, 64, 56, 56), np.float32))
    assert _rsplits(x.sum(axis=(0, 2, 3)), 256) == [("sum", (0, 2, 3), 17, 256)]
    y = plait.tensor(np.zeros((4096, 2048), np.float32))
    items = schedule([y.sum(axis=1).node], 256)
    assert [it.out.arg for it in items if it.out.op == "rsplit"] == [("sum", (1,), 1, 256)]
    assert [it.kind for it in items].count("reduce") == 1
    assert _rsplits(x.sum(axis=(0, 2, 3)), 16) == [("sum", (0, 2, 3), 16, 1)]


def test_outer_axis_reductions_keep_one_work_item_per_partial() -> None:
    """A sum over rows only (a bias gradient) reads its column with a stride, so it keeps adjacent work-items on
    adjacent outputs: none split below 4096 rows, 256 interleaved one-work-item partials from there."""
    assert _rsplits(plait.tensor(np.zeros((2048, 768), np.float32)).sum(axis=0), 256) == []
    assert _rsplits(plait.tensor(np.zeros((8192, 768), np.float32)).sum(axis=0), 256) == [("sum", (0,), 128, 1)]


def test_outer_axis_split_matches_numpy(device: str) -> None:
    a = rand((8192, 40), seed=7)
    assert_close(
        plait.tensor(a, device=device).sum(axis=0).numpy(),
        a.astype(np.float64).sum(axis=0),
        "float32",
        "sum over 8192 rows",
        tol_scale=10,
    )


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("shape", [(16, 24, 33, 31), (3, 5000)])
def test_group_reduce_matches_numpy(device: str, op: str, shape: tuple[int, ...]) -> None:
    a = rand(shape, seed=4)
    axes = (0, 2, 3) if len(shape) == 4 else (1,)
    got = getattr(plait.tensor(a, device=device), op)(axis=axes).numpy()
    want = getattr(np, op)(a.astype(np.float64), axis=axes)
    assert_close(got, want, "float32", f"{op} over {axes} of {shape}", tol_scale=10)


@pytest.mark.parametrize("op", ["max", "min"])
def test_group_reduce_propagates_nan(device: str, op: str) -> None:
    a = rand((4, 6000), seed=5)
    a[1, 4321] = np.nan
    got = getattr(plait.tensor(a, device=device), op)(axis=1).numpy()
    want = getattr(np, op)(a, axis=1)
    assert np.isnan(got[1]) and not np.isnan(got[[0, 2, 3]]).any()
    np.testing.assert_array_equal(got[[0, 2, 3]], want[[0, 2, 3]])


def test_group_reduce_integer_sum(device: str) -> None:
    a = np.random.default_rng(6).integers(-1000, 1000, size=(2, 9000)).astype(np.int32)
    got = plait.tensor(a, device=device).sum(axis=1).numpy()
    np.testing.assert_array_equal(got, a.sum(axis=1))
