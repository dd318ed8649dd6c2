"""A/B of a change to the cpu kernels' C source, side by side in one process: plan A is a benchmark CNN's twin as
the tree builds it, plan B the same twin with OLD replaced by NEW in every kernel's source before it is compiled
(checked to give the same result); their replays take turns, three at a time after one untimed replay, the order
reversed every round, so load from other jobs falls on both alike. --fifo runs every thread at SCHED_FIFO priority
1 while timing (root only). Median replay ms [q1, q3] per plan.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_source_ab.py \
        mobilenet_v2 "schedule(static) nowait" "schedule(dynamic, 1) nowait" --fifo
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

import plait.runtime.cpu as cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, twin
from bench_team_barrier import scheduling


def patched_compilers(pairs: list[tuple[str, str]]) -> None:
    """From now on the cpu device compiles every kernel source with each (old, new) of `pairs` replaced in turn."""
    batch, one = cpu.CPUDevice.compile_batch, cpu.CPUDevice.compile

    def patch(source: str) -> str:
        for old, new in pairs:
            source = source.replace(old, new)
        return source

    def compile_batch(self: cpu.CPUDevice, kernels: list[tuple[str, str]]) -> list[Any]:
        return batch(self, [(patch(s), n) for s, n in kernels])

    def compile_one(self: cpu.CPUDevice, source: str, name: str) -> Any:
        return one(self, patch(source), name)

    cpu.CPUDevice.compile_batch = compile_batch  # type: ignore[method-assign]
    cpu.CPUDevice.compile = compile_one  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--pair", nargs=2, action="append", default=[], metavar=("OLD", "NEW"), help="more replacements")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--fifo", action="store_true")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    fa = twin(args.model, "cpu")
    plan_a, _ = fa.plan_for([x])
    ya = np.asarray(fa(x))
    patched_compilers([(args.old, args.new), *map(tuple, args.pair)])
    fb = twin(args.model, "cpu")
    plan_b, _ = fb.plan_for([x])
    yb = np.asarray(fb(x))
    changed = sum(args.old in k.source for k in plan_b.kernels)
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
        "kernels changed": changed,
        "max abs diff": float(np.abs(ya - yb).max()),
        "rounds": rounds,
        "load": round(os.getloadavg()[0], 2),
    }
    for label, t in times.items():
        out[f"{label} ms [q1, q3]"] = [round(float(np.percentile(t, q)), 3) for q in (50, 25, 75)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
