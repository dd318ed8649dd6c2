"""split_batch: how a plan's kernels are dealt into groups that build in parallel (one compiler run per group)."""

from __future__ import annotations

from plait.runtime.base import split_batch


def _kernels(sizes: list[int]) -> list[tuple[str, str]]:
    return [("x" * n, f"k{i}") for i, n in enumerate(sizes)]


def test_every_kernel_once_and_balanced() -> None:
    kernels = _kernels([900, 100, 500, 400, 300, 200, 100, 100])
    groups = split_batch(kernels, 3)
    assert len(groups) == 3
    assert sorted(k for g in groups for k in g) == sorted(kernels)
    loads = [sum(len(src) for src, _ in g) for g in groups]
    assert max(loads) == 900 and min(loads) >= 800  # largest first, each to the lightest group


def test_deterministic_and_bounded() -> None:
    kernels = _kernels([50, 50, 50, 70])
    assert split_batch(kernels, 2) == split_batch(list(reversed(kernels)), 2)  # same groups, same cache keys
    assert len(split_batch(kernels, 16)) == 4  # never an empty group
    assert split_batch(kernels, 0) == [sorted(kernels, key=lambda k: (-len(k[0]), k[1]))]
