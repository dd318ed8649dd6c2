"""Each kernel of a twin's plan launched in network order against the same kernel launched twice in a row (the second
timed), per kernel and per kind, plus whole team replays: where a replay's time goes beyond its kernels' "alone" time.

A kernel launched twice finds its weights and its input in its own cores' caches the second time; in a replay it finds
them wherever the previous kernels left them (L3, or the other core's L2). The gap between the two sums is that cost,
the team run's barriers excluded (each launch here opens its own parallel region). Both passes run in one process,
taking turns every round, with OMP_NUM_THREADS threads; --fifo runs them at SCHED_FIFO priority 1 (root only).

    OMP_WAIT_POLICY=ACTIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_sequence_gap.py \
        mobilenet_v2 --fifo
"""

from __future__ import annotations

import argparse
import collections
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
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--top", type=int, default=12, help="list the kernels that lose most in order")
    ap.add_argument("--fifo", action="store_true")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    f = twin(args.model, "cpu")
    plan, _ = f.plan_for([x])
    f(x)
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    n = len(plan.launches)
    in_order: list[list[float]] = [[] for _ in range(n)]
    alone: list[list[float]] = [[] for _ in range(n)]
    replays = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        plan.run()
        replays.append(time.perf_counter() - t0)
        for i, launch in enumerate(plan.launches):
            t0 = time.perf_counter()
            launch()
            in_order[i].append(time.perf_counter() - t0)
        for i, launch in enumerate(plan.launches):
            launch()
            t0 = time.perf_counter()
            launch()
            alone[i].append(time.perf_counter() - t0)
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    seq = [float(np.median(t)) * 1e3 for t in in_order]
    two = [float(np.median(t)) * 1e3 for t in alone]
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for k, a, b in zip(plan.kernels, seq, two, strict=True):
        kinds[k.name.split("_")[0]][0] += a
        kinds[k.name.split("_")[0]][1] += b
    print(
        json.dumps(
            {
                "model": args.model,
                "batch": args.batch,
                "threads": os.environ.get("OMP_NUM_THREADS"),
                "load": round(os.getloadavg()[0], 2),
                "team replay ms (median)": round(float(np.median(replays)) * 1e3, 2),
                "in order ms (sum of medians)": round(sum(seq), 2),
                "alone ms (sum of medians)": round(sum(two), 2),
                "by kind (in order ms, alone ms)": {k: [round(a, 2), round(b, 2)] for k, (a, b) in kinds.items()},
            }
        )
    )
    rows = sorted(zip(plan.kernels, seq, two, strict=True), key=lambda r: r[1] - r[2], reverse=True)
    for k, a, b in rows[: args.top]:
        print(f"  +{a - b:.3f} ms  in order {a:.3f}  alone {b:.3f}  {k.name}")


if __name__ == "__main__":
    main()
