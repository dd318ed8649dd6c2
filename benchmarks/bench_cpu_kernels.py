"""CPU time of one inference plan on the `cpu` device, kernel by kernel, measured with `time.thread_time`.

Run with OMP_NUM_THREADS=1 so each kernel runs on the calling thread; thread CPU time then counts only the cycles
the kernel itself used, which keeps the numbers comparable on a machine that other jobs share (wall times there
swing by tens of percent).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_cpu_kernels.py resnet18 --batch 1 --top 10
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import numpy as np

import plait
import plait.nn as pnn
from plait.models import architectures


def kernel_times(kernels: list[Any], launches: list[Any], repeats: int) -> list[tuple[float, str]]:
    """(fastest thread CPU seconds of `repeats` launches, kernel name) per kernel of a plan that has run once."""
    per: list[tuple[float, str]] = []
    for kernel, launch in zip(kernels, launches, strict=True):
        best = float("inf")
        for _ in range(repeats):
            t0 = time.thread_time()
            launch()
            best = min(best, time.thread_time() - t0)
        per.append((best, kernel.name))
    return per


def by_kind(per: list[tuple[float, str]]) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Summed seconds and kernel count per kind of kernel (the name's prefix: CONV, GEMV, E, R, ...)."""
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for t, name in per:
        total[name.split("_")[0]] += t
        count[name.split("_")[0]] += 1
    return total, count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=["alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="launches per kernel; the fastest counts")
    ap.add_argument("--top", type=int, default=10, help="list this many of the slowest kernels")
    args = ap.parse_args()
    model = architectures.builders(pnn)[args.model]()
    model.eval()
    f = plait.jit(lambda t: model(t), device="cpu")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plan, _ = f.plan_for([x])
    f(x)  # copies the input in and runs once, so every kernel reads real data
    per = kernel_times(plan.kernels, plan.launches, args.repeats)
    total, count = by_kind(per)
    print(f"{args.model} b{args.batch}: total {sum(t for t, _ in per) * 1e3:.1f} ms cpu, {len(per)} kernels")
    for kind, t in total.most_common():
        print(f"  {kind:8s} {count[kind]:4d} {t * 1e3:8.1f} ms")
    for t, name in sorted(per, reverse=True)[: args.top]:
        print(f"  {t * 1e3:8.2f} ms  {name}")


if __name__ == "__main__":
    main()
