"""A cpu plan's team runs with different barrier spins, side by side in one process: the same kernels and buffers,
only how long a thread that reaches a team barrier first spins before it sleeps on a futex (TeamCell.spin), with
ONNX Runtime's time beside them. Per spin: median replay time [q1, q3] and voluntary context switches per replay
(each one a thread put to sleep and later woken). Spins take turns three replays at a time (the order reversed
every round), ORT runs twice after each round, then a pause of --settle seconds (20 ms; its threads spin after a run). `--cold` times
one replay per turn right after ORT and the pause instead (weights back from memory, the team woken from sleep).
`--fifo` runs every thread of the process at SCHED_FIFO priority 1 while it times (root only), which keeps the other
jobs of a shared machine from preempting the replays; they still share its caches and memory.

    OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_team_barrier.py mobilenet_v2 \
        --batch 1 --seconds 10 --spins 0,20000,60000,200000 --fifo
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from plait.runtime.cpu_team import TeamRun

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin


def scheduling(policy: int, priority: int) -> None:
    """Every thread of this process (OpenMP's and ORT's included) to `policy` at `priority`."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setscheduler(int(tid), policy, os.sched_param(priority))
        except OSError:
            pass


def replay(plan: Any) -> tuple[float, int]:
    """One replay: its milliseconds and the voluntary context switches of the process during it."""
    c0 = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    t0 = time.perf_counter()
    plan.run()
    ms = (time.perf_counter() - t0) * 1e3
    return ms, resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--spins", default="0,60000", help="comma-separated spin times in ns")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--settle", type=float, default=0.02, help="seconds of pause after ORT's runs (its workers spin)")
    ap.add_argument("--fifo", action="store_true")
    args = ap.parse_args()
    spins = [int(s) for s in args.spins.split(",")]
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    f = twin(args.model, "cpu")
    plan, _ = f.plan_for([x])
    y = np.asarray(f(x))
    teams = [r for r in plan.replay if isinstance(r, TeamRun)]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = 2, 1
    sess = ort.InferenceSession(export(args.model), opts, providers=["CPUExecutionProvider"])
    err = float(np.abs(sess.run(None, {"x": x})[0] - y).max())
    times: dict[int, list[float]] = {s: [] for s in spins}
    switches: dict[int, list[int]] = {s: [] for s in spins}
    ort_ms: list[float] = []

    def run_ort() -> None:
        t0 = time.perf_counter()
        sess.run(None, {"x": x})
        ort_ms.append((time.perf_counter() - t0) * 1e3)

    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    end, rounds = time.perf_counter() + args.seconds, 0
    while time.perf_counter() < end or rounds < 3:
        rounds += 1
        for s in spins if rounds % 2 else spins[::-1]:
            for team in teams:
                team.cell.spin = s
            if args.cold:
                run_ort()
                time.sleep(args.settle)
            else:
                plan.run()
            for _ in range(1 if args.cold else 3):
                ms, cs = replay(plan)
                times[s].append(ms)
                switches[s].append(cs)
        if not args.cold:
            run_ort()
            run_ort()
            time.sleep(args.settle)
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    out: dict[str, Any] = {
        "model": args.model,
        "batch": args.batch,
        "steps": sum(len(t.sync) for t in teams),
        "barriers between steps": sum(sum(t.sync) for t in teams),
        "rounds": rounds,
        "load": round(os.getloadavg()[0], 2),
        "ort ms": round(float(np.median(ort_ms)), 2),
        "ort max abs diff": err,
    }
    for s in spins:
        t = times[s]
        out[f"spin {s // 1000} us: ms [q1, q3], switches"] = [
            round(float(np.median(t)), 2),
            round(float(np.percentile(t, 25)), 2),
            round(float(np.percentile(t, 75)), 2),
            float(np.median(switches[s])),
        ]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
