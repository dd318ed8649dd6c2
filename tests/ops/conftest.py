"""Fixtures shared by the cpu team-run tests: how many threads the regions a test opens get."""

import contextlib
import ctypes
from collections.abc import Iterator

import pytest

_GOMP = ctypes.CDLL("libgomp.so.1")


@contextlib.contextmanager
def omp_threads(n: int) -> Iterator[int]:
    """Regions opened from this (the test's) thread use `n` threads inside: standalone kernels and team runs."""
    before = _GOMP.omp_get_max_threads()
    _GOMP.omp_set_num_threads(n)
    try:
        yield n
    finally:
        _GOMP.omp_set_num_threads(before)


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest) -> Iterator[int]:
    with omp_threads(request.param) as n:
        yield n


@pytest.fixture(params=[1, 2, 3], ids=["1-thread", "2-threads", "3-threads"])
def team_size(request: pytest.FixtureRequest) -> Iterator[int]:
    """Also an odd count: splits that halve work must still cover it all."""
    with omp_threads(request.param) as n:
        yield n
