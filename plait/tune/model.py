"""Tuning a whole compiled plan within a time budget: every GEMM of the plan (convolutions included) is timed with
each candidate configuration on the plan's own buffers, and the fastest one that computes the same result is
remembered per (device, kernel signature) in the tuning cache, where later plans on that device pick it up.

The budget bounds the search, compiler runs included: the largest products go first, and whatever the budget does
not reach keeps its heuristic. Products already in the cache are not searched again, so a second run is free.

>>> import numpy as np, plait                                                      # doctest: +SKIP
>>> from plait.tune.model import tune_plan                                         # doctest: +SKIP
>>> f = plait.jit(lambda a, b: (a @ b).relu(), device="cpu")                       # doctest: +SKIP
>>> plan, _ = f.plan_for([np.ones((256, 256), np.float32)] * 2)                    # doctest: +SKIP
>>> print(tune_plan(plan, budget_s=20).summary())                                  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plait.codegen.gemm import direct_conv
from plait.errors import PlaitError
from plait.runtime.base import Buffer
from plait.schedule.plan import Plan, read, render
from plait.schedule.scheduler import Item
from plait.tune import _db, candidates, knobs_for, remember, signature

# a candidate's output must match the heuristic kernel's to this fraction of the output's largest magnitude
AGREE = 1e-3
# kernel kinds whose knobs change nothing worth timing (one fixed kernel per shape)
_FIXED = ("DWCONV", "GEMV")


@dataclass
class Tuned:
    """One product of the plan: its shape, the heuristic's and the winner's time, and the winner's knobs."""

    shape: str
    count: int
    before_s: float
    after_s: float
    knobs: dict[str, int]
    tried: int


@dataclass
class TuneReport:
    device: str
    budget_s: float
    spent_s: float = 0.0
    tuned: list[Tuned] = field(default_factory=list)
    cached: int = 0  # products whose winner was already in the cache
    fixed: int = 0  # products with nothing to choose (depthwise, matrix-vector, image stems on the cpu)
    left: int = 0  # products the budget did not reach

    def summary(self) -> str:
        """A table of the tuned products and what the budget covered."""
        lines = [
            f"plait tune on {self.device}: {self.spent_s:.1f} s of a {self.budget_s:.0f} s budget; "
            f"{len(self.tuned)} products searched, {self.cached} already cached, {self.fixed} with nothing to tune, "
            f"{self.left} left for lack of time",
            "| product (batch x M x N x K) | uses | heuristic ms | tuned ms | speedup | knobs | tried |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in self.tuned:
            lines.append(
                f"| {t.shape} | {t.count} | {t.before_s * 1e3:.3f} | {t.after_s * 1e3:.3f} | "
                f"{t.before_s / t.after_s:.2f}x | {t.knobs or 'heuristic'} | {t.tried} |"
            )
        return "\n".join(lines)


def _median_time(device: Any, launch: Callable[[], Any], reps: int) -> float:
    launch()
    device.synchronize()
    times = sorted(device.time_launch(launch) for _ in range(reps))
    return times[len(times) // 2]


def _output(device: Any, buf: Buffer, item: Item) -> np.ndarray:
    device.synchronize()
    return read(device, buf, item.out)


def tune_plan(
    plan: Plan, budget_s: float = 60.0, reps: int = 5, log: Callable[[str], None] | None = None
) -> TuneReport:
    """Search GEMM configurations for every product of `plan` within `budget_s` seconds and cache the winners.

    The plan must have run once (its buffers hold real data). Its own launches keep the kernels they were built
    with: build the plan again (a new `plait.jit`, a new session) to run the tuned kernels."""
    if budget_s <= 0:
        raise PlaitError(f"plait tune: the budget must be positive, got {budget_s} s")
    device = plan.device
    say = log or (lambda s: print(s, file=sys.stderr))
    report = TuneReport(device.name, budget_s)
    start = time.perf_counter()
    groups: dict[Any, list[Item]] = {}
    for item in plan.items:
        if item.kind == "gemm" and item.gemm is not None and item.out.size:
            groups.setdefault(item.gemm, []).append(item)
    order = sorted(groups.items(), key=lambda kv: -kv[0].flops * len(kv[1]))
    db = _db(device)
    for n_done, (spec, items) in enumerate(order):
        if signature("gemm", spec) in db:
            report.cached += 1
            continue
        item = items[0]
        base = render(device, item)
        # a weight packed at plan build (gemm_c.APack) fixes the tile it was packed for: every candidate would
        # render the same kernel
        packed = "apack" in item.extra
        if base.name.split("_", 1)[0] in _FIXED or (device.renderer.dialect == "c" and direct_conv(spec)) or packed:
            report.fixed += 1
            continue
        if time.perf_counter() - start > budget_s:
            report.left = sum(signature("gemm", s) not in db for s, _ in order[n_done:])
            break
        heuristic = knobs_for(device, "gemm", spec)
        at = plan.launched.index(item)
        bufs = plan.bound[at].buffers  # what the plan's own launch runs on, output first
        for launch in plan.launches[:at]:  # later launches may have reused its inputs' storage: recompute them
            launch()
        out = bufs[0]
        kernels = [(heuristic, base)]
        for knobs in candidates(device, spec):
            if knobs == heuristic:
                continue
            try:
                kernels.append((knobs, render(device, item, knobs)))
            except PlaitError:
                continue  # this configuration cannot express the product (tile larger than the shape, say)
        try:
            programs = device.compile_batch([(k.source, k.name) for _, k in kernels])
        except PlaitError:  # one candidate the device compiler rejects: build them one by one instead
            programs = []
            for knobs, k in list(kernels):
                try:
                    programs.append(device.compile(k.source, k.name))
                except PlaitError:
                    kernels.remove((knobs, k))
        launches = [p.bind(bufs, k.global_size, k.local_size) for (_, k), p in zip(kernels, programs, strict=True)]
        before = _median_time(device, launches[0], reps)
        want = _output(device, out, item)
        scale = float(np.max(np.abs(want))) or 1.0
        best, best_t, tried = heuristic, before, 1
        for (knobs, _), launch in zip(kernels[1:], launches[1:], strict=True):
            if time.perf_counter() - start > budget_s:
                break
            t = _median_time(device, launch, reps)
            tried += 1
            got = _output(device, out, item)
            if not np.all(np.abs(got - want) <= AGREE * scale):
                say(f"plait tune: {knobs} computes a different {_shape(spec)} product; not used")
                continue
            if t < best_t:
                best, best_t = knobs, t
        launches[0]()  # leave the heuristic's result in the plan's buffer
        # a winner under 3% faster is timing noise: the heuristic stays (cached as tuned, so not searched again)
        chosen = best if best_t < 0.97 * before else heuristic
        remember(device, "gemm", spec, chosen if chosen is not heuristic else {})
        report.tuned.append(
            Tuned(_shape(spec), len(items), before, best_t if chosen is best else before, dict(chosen), tried)
        )
        say(f"plait tune: {_shape(spec)} x{len(items)}: {before * 1e3:.3f} -> {report.tuned[-1].after_s * 1e3:.3f} ms")
    device.synchronize()
    report.spent_s = time.perf_counter() - start
    return report


def _shape(spec: Any) -> str:
    conv = " conv" if spec.conv is not None else ""
    return f"{spec.batch}x{spec.m}x{spec.n}x{spec.k}{conv}"
