"""A net's plan on the `cpu` device with and without 1x1 convolutions across the vector lanes (weights packed at plan
build, plait/codegen/pointwise_c.py), in one process: kernel by kernel in turn (bench_onnx_kernels), then whole
replays alternated, with ONNX Runtime's whole run of the exported model beside them (same weights).

"before" builds the plan with the scheduler's `_pointwise_lanes` pass off (those products run as the GEMM); "after"
is the code as it is. One thread (the default) times thread CPU seconds, fewest of --repeats; with
PLAIT_NUM_THREADS=2 (and ORT on two threads) the whole replays are timed by wall clock, medians. Prints the kernels
whose time differs by more than --show percent.

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_pwlanes_ab.py mobilenet_v2 --batch 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PLAIT_NUM_THREADS", "1")

import numpy as np
import onnxruntime as ort

from plait.schedule import scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import export, twin
from bench_onnx_kernels import interleaved_kernel_times, report
from bench_team_barrier import scheduling


def build(name: str, x: np.ndarray, before: bool) -> tuple[Any, Any]:
    """(the twin, its plan for `x`), built without the lanes pass when `before`."""
    saved = scheduler._pointwise_lanes
    if before:
        scheduler._pointwise_lanes = lambda items: items
    try:
        f = twin(name, "cpu")
        f(x)
        return f, f.plan_for([x])[0]
    finally:
        scheduler._pointwise_lanes = saved


def whole_runs(fns: dict[str, Any], repeats: int, wall: bool) -> dict[str, list[float]]:
    """Seconds of each function's calls per round: the plans "before" and "after" take turns going first, then ORT
    runs, then a 50 ms pause, so that no plan meets ORT's still-spinning thread pool."""
    clock = time.perf_counter if wall else time.thread_time
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats):
        for label in ("before", "after", "ORT") if r % 2 == 0 else ("after", "before", "ORT"):
            t0 = clock()
            fns[label]()
            times[label].append(clock() - t0)
        time.sleep(0.05)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--show", type=float, default=5.0, help="list kernels whose times differ by more than this %%")
    ap.add_argument("--fifo", action="store_true", help="time the whole replays at SCHED_FIFO priority 1 (root only)")
    args = ap.parse_args()
    threads = int(os.environ["PLAIT_NUM_THREADS"])
    print(f"{args.model} b{args.batch}, {threads} thread(s), load average {os.getloadavg()} at the start")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    (fb, before), (fa, after) = build(args.model, x, True), build(args.model, x, False)
    np.testing.assert_allclose(np.asarray(fa(x)), np.asarray(fb(x)), rtol=1e-4, atol=1e-4)
    if threads == 1:
        times = interleaved_kernel_times({"before": before, "after": after}, args.repeats)
        for label, per in times.items():
            report(f"  kernels, {label}", per, 0)
        print("| kernel | before ms | after ms |")
        print("| --- | --- | --- |")
        for (t0, name), (t1, name1) in zip(times["before"], times["after"], strict=True):
            if abs(t1 - t0) > args.show / 100 * t0:
                print(f"| {name.rsplit('_', 1)[0]} -> {name1.rsplit('_', 1)[0]} | {t0 * 1e3:.3f} | {t1 * 1e3:.3f} |")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(export(args.model), opts, providers=["CPUExecutionProvider"])
    fns = {"before": before.run, "after": after.run, "ORT": lambda: sess.run(None, {"x": x})}
    for fn in fns.values():
        fn()
    if args.fifo:  # every thread of the process (OpenMP's and ORT's): other jobs do not preempt the replays
        scheduling(os.SCHED_FIFO, 1)
    try:
        runs = whole_runs(fns, args.repeats, wall=threads > 1)
    finally:
        if args.fifo:
            scheduling(os.SCHED_OTHER, 0)
    pick = (lambda v: float(np.median(v))) if threads > 1 else min
    stat = "median (p25-p75) wall" if threads > 1 else "fewest thread CPU"
    got = {k: pick(v) for k, v in runs.items()}
    spread = {k: np.percentile(v, [25, 75]) * 1e3 for k, v in runs.items()}
    cells = (
        f"{k} {v * 1e3:.2f}" + (f" ({spread[k][0]:.2f}-{spread[k][1]:.2f})" if threads > 1 else "")
        for k, v in got.items()
    )
    print(f"whole replays ({stat} ms{', SCHED_FIFO' if args.fifo else ''}): " + ", ".join(cells))
    print(f"plait / ORT: before {got['before'] / got['ORT']:.3f}, after {got['after'] / got['ORT']:.3f}")
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
