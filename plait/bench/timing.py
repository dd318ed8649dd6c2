"""Timing with warm-up and device synchronisation; medians with spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def measure(fn: Callable[[], Any], sync: Callable[[], Any] | None = None, warmup: int = 2, iters: int = 10,
            max_seconds: float = 20.0) -> dict[str, float]:
    """Run fn `warmup` times, then up to `iters` timed runs (fewer if they exceed max_seconds); times in ms."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - start > max_seconds and len(times) >= 3:
            break
    times.sort()
    return {
        "median_ms": statistics.median(times),
        "min_ms": times[0],
        "max_ms": times[-1],
        "iters": len(times),
    }
