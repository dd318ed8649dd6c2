"""Timing with warm-up and device synchronisation; medians with spread."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def measure(
    fn: Callable[[], Any],
    sync: Callable[[], Any] | None = None,
    warmup: int = 2,
    iters: int = 10,
    max_seconds: float = 20.0,
) -> dict[str, Any]:
    """Run fn `warmup` times, then up to `iters` timed runs (at least 3, fewer than `iters` once they pass
    `max_seconds`), each ended by `sync`. Times in ms: median, quartiles, min, max, and every sample."""
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
    return {**summarize(times), "warmup": warmup}


def summarize(times: list[float]) -> dict[str, Any]:
    """Samples in ms (in the order taken) as median, quartiles, min, max, count and the samples themselves."""
    ordered = sorted(times)
    q = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median_ms": statistics.median(ordered),
        "p25_ms": q[0],
        "p75_ms": q[2],
        "min_ms": ordered[0],
        "max_ms": ordered[-1],
        "iters": len(times),
        "samples_ms": [round(t, 4) for t in times],
    }
