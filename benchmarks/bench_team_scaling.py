"""Where a cpu plan's two-thread time goes: each kernel of a benchmark CNN's twin launched alone on one thread and on
two (wall time, median of --repeats launches, the thread counts taking turns kernel by kernel), its speedup, and the
time it loses against a perfect 2x; then the whole two-thread team replay against the sum of its kernels' two-thread
times (the gap is the team run's barriers, sleeps and imbalance between its steps). Run it with
OMP_WAIT_POLICY=ACTIVE so a lone launch does not pay for waking a sleeping thread, and --fifo on a shared machine.

    OMP_WAIT_POLICY=ACTIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python \
        benchmarks/bench_team_scaling.py resnet18 --batch 1 --fifo --top 15
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, twin
from bench_team_barrier import scheduling


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15, help="launches per kernel and thread count; the median counts")
    ap.add_argument("--replays", type=int, default=30, help="two-thread team replays; the median counts")
    ap.add_argument("--top", type=int, default=15, help="list this many kernels, most time lost first")
    ap.add_argument("--only", default="", help="time only the kernels whose names start with this")
    ap.add_argument("--fifo", action="store_true", help="SCHED_FIFO priority 1 for every thread while timing (root)")
    args = ap.parse_args()
    gomp = ctypes.CDLL("libgomp.so.1")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    f = twin(args.model, "cpu")
    plan, _ = f.plan_for([x])
    f(x)
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    # passes over the plan at one thread count, the counts taking turns (a team that changes size between two
    # launches costs the second one tens of microseconds, which would bias the short kernels)
    times: dict[int, list[list[float]]] = {n: [[] for _ in plan.launches] for n in (1, 2)}
    for r in range(args.repeats):
        for n in (1, 2) if r % 2 == 0 else (2, 1):
            gomp.omp_set_num_threads(n)
            for i, launch in enumerate(plan.launches):
                if plan.kernels[i].name.startswith(args.only):
                    launch()
                    t0 = time.perf_counter()
                    launch()
                    times[n][i].append(time.perf_counter() - t0)
                else:
                    times[n][i].append(0.0 if n == 1 else 1e-9)
    gomp.omp_set_num_threads(2)
    replays = []
    for _ in range(args.replays):
        t0 = time.perf_counter()
        plan.run()
        replays.append(time.perf_counter() - t0)
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    one = [float(np.median(t)) * 1e3 for t in times[1]]
    two = [float(np.median(t)) * 1e3 for t in times[2]]
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for k, a, b in zip(plan.kernels, one, two, strict=True):
        kinds[k.name.split("_")[0]][0] += a
        kinds[k.name.split("_")[0]][1] += b
    print(
        json.dumps(
            {
                "model": args.model,
                "batch": args.batch,
                "load": round(os.getloadavg()[0], 2),
                "kernels": len(one),
                "sum 1 thread ms": round(sum(one), 2),
                "sum 2 threads ms": round(sum(two), 2),
                "speedup": round(sum(one) / sum(two), 3),
                "lost vs 2x ms": round(sum(two) - sum(one) / 2, 2),
                "team replay ms (median)": round(float(np.median(replays)) * 1e3, 2),
                "by kind (1t ms, 2t ms)": {k: [round(a, 2), round(b, 2)] for k, (a, b) in kinds.items()},
            }
        )
    )
    rows = sorted(zip(plan.kernels, one, two, strict=True), key=lambda r: r[2] - r[1] / 2, reverse=True)
    for k, a, b in rows[: args.top]:
        print(f"  lost {b - a / 2:6.3f} ms  1t {a:7.3f}  2t {b:7.3f}  x{a / b:4.2f}  {k.name}")


if __name__ == "__main__":
    main()
