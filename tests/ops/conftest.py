"""Fixtures shared by the cpu team-run tests."""

import ctypes
from collections.abc import Iterator

import pytest

_GOMP = ctypes.CDLL("libgomp.so.1")


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    """Regions opened from this (the test's) thread use `request.param` threads: standalone kernels and team runs."""
    before = _GOMP.omp_get_max_threads()
    _GOMP.omp_set_num_threads(request.param)
    yield request.param
    _GOMP.omp_set_num_threads(before)
