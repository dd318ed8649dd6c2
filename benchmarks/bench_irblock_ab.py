"""A/B of the fused inverted-residual blocks (plait/schedule/irblock.py) on a benchmark CNN's twin at inference, in one
process: plan A is built with the fusion off (irblock.MAX_PIXELS = 0: the expand, depthwise and projection kernels
apart), plan B with input planes up to --pixels fused; their replays take turns, three at a time after one untimed
replay, the order reversed every round, so load from other jobs falls on both alike. --fifo runs every thread at
SCHED_FIFO priority 1 while timing (root only). Prints median replay ms [q1, q3] per plan, the fused block count and
the largest difference of the outputs.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_irblock_ab.py \
        mobilenet_v2 --fifo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from plait.schedule import irblock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, twin
from bench_team_barrier import scheduling


def build(model: str, x: np.ndarray, pixels: int) -> tuple[Any, np.ndarray]:
    """The twin's plan for `x` with blocks on input planes of up to `pixels` pixels fused, and its output."""
    saved = irblock.MAX_PIXELS
    irblock.MAX_PIXELS = pixels
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y
    finally:
        irblock.MAX_PIXELS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--pixels", type=int, default=irblock.MAX_PIXELS, help="plan B fuses input planes up to this")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--fifo", action="store_true")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plan_a, ya = build(args.model, x, 0)
    plan_b, yb = build(args.model, x, args.pixels)
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    times: dict[str, list[float]] = {"A": [], "B": []}
    end, rounds = time.perf_counter() + args.seconds, 0
    while time.perf_counter() < end or rounds < 3:
        pair = [("A", plan_a), ("B", plan_b)]
        for label, plan in pair if rounds % 2 == 0 else pair[::-1]:
            plan.run()
            for _ in range(3):
                t0 = time.perf_counter()
                plan.run()
                times[label].append((time.perf_counter() - t0) * 1e3)
        rounds += 1
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    out: dict[str, Any] = {
        "model": args.model,
        "batch": args.batch,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "pixels": args.pixels,
        "fused blocks": sum(k.name.startswith("IRBLOCK") for k in plan_b.kernels),
        "kernels A, B": [len(plan_a.kernels), len(plan_b.kernels)],
        "max abs diff": float(np.abs(ya - yb).max()),
        "max abs output": float(np.abs(ya).max()),
        "rounds": rounds,
        "load": round(os.getloadavg()[0], 2),
    }
    for label, t in times.items():
        out[f"{label} ms [q1, q3]"] = [round(float(np.percentile(t, q)), 3) for q in (50, 25, 75)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
