"""On OpenCL a group-split sum over a stack along axis 0 (batch norm's two moments, its two backward sums) sums
every member in one work-group, so the activation or gradient the members share is loaded once per position
(`cstyle._stacked_members`). The rendered kernel, and batch norm's forward and gradients through it against
PyTorch on every device."""

from __future__ import annotations

import numpy as np
import pytest

import plait
import plait.nn.functional as F
from plait.runtime import get_device
from plait.schedule.plan import render
from plait.schedule.scheduler import schedule
from tests.helpers import check_batch_norm_training


def test_stack_of_moments_renders_one_loop_reading_x_once() -> None:
    """The moments of x (4 x 16 x 32 x 32) are one partial kernel with two accumulators and one load of x per
    position; member 1's partials follow member 0's."""
    try:
        dev = get_device("opencl:0")
    except plait.PlaitError as e:
        pytest.skip(f"no OpenCL device: {e}")
    x = plait.tensor(np.zeros((4, 16, 32, 32), np.float32), device="opencl:0")
    m = F.batch_norm(x, None, None, None, None, training=True)
    items = [it for it in schedule([m.node], 256) if it.kind == "reduce" and it.out.op == "rsplit"]
    stacked = [it for it in items if it.out.shape[0] == 2]
    assert len(stacked) == 1, [it.out.shape for it in items]
    src = render(dev, stacked[0]).source
    loop = src[src.index("for (int r") : src.index("__local")]
    assert "acc0 = acc0 +" in loop and "acc1 = acc1 +" in loop
    assert loop.count("b1[") == 2, loop  # x at r and the shift x[c, 0] (not four loads)
    half = stacked[0].out.size // 2
    assert f"b0[w1 + {half}] = sh[256];" in src


@pytest.mark.parametrize("shape", [(2, 8, 32, 32), (3, 24, 28, 28)])
def test_batch_norm_through_stacked_sums_matches_torch(device: str, shape: tuple[int, ...]) -> None:
    """Forward output and the gradients of x, weight and bias (relu after, squared loss) against PyTorch float64;
    the second shape's reduction length (2352) is not a multiple of the work-group."""
    check_batch_norm_training(device, shape)
