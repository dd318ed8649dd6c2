"""A kernel launch the device refuses (out of memory, a failing driver) surfaces as a DeviceError that says what to
do, and the allocator gives back the blocks it keeps for reuse."""

from __future__ import annotations

import numpy as np
import pytest

import plait
from plait.errors import DeviceError
from plait.runtime import get_device


def _plan():
    f = plait.jit(lambda a: (a * 2.0).relu(), device="cpu")
    x = np.ones((4, 4), np.float32)
    f(x)
    return f.plan_for([x])[0]


def test_a_failed_launch_is_a_device_error_and_releases_cached_blocks(monkeypatch):
    plan = _plan()
    device = get_device("cpu")
    device.allocator.free(64, np.empty(64, np.uint8))  # a cached block

    def refuse() -> None:
        raise RuntimeError("clEnqueueNDRangeKernel failed: MEM_OBJECT_ALLOCATION_FAILURE")

    monkeypatch.setattr(type(device), "launch_errors", (RuntimeError,))
    monkeypatch.setattr(plan, "replay", [refuse])
    with pytest.raises(DeviceError, match="out of memory: use a smaller batch"):
        plan.run()
    assert not device.allocator.pool


def test_release_cached_counts_the_bytes_it_gives_back():
    alloc = get_device("cpu").allocator
    alloc.release_cached()
    alloc.free(128, np.empty(128, np.uint8))
    alloc.free(128, np.empty(128, np.uint8))
    alloc.free(32, np.empty(32, np.uint8))
    assert alloc.release_cached() == 288
    assert alloc.release_cached() == 0
