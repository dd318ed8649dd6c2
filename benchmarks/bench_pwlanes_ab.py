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
    """Seconds of each function's calls, the functions called in turn (the first of them alternating per round)."""
    clock = time.perf_counter if wall else time.thread_time
    times: dict[str, list[float]] = {k: [] for k in fns}
    labels = list(fns)
    for r in range(repeats):
        for label in labels if r % 2 == 0 else labels[::-1]:
            t0 = clock()
            fns[label]()
            times[label].append(clock() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--show", type=float, default=5.0, help="list kernels whose times differ by more than this %%")
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
    runs = whole_runs(fns, args.repeats, wall=threads > 1)
    pick = (lambda v: float(np.median(v))) if threads > 1 else min
    stat = "median wall" if threads > 1 else "fewest thread CPU"
    got = {k: pick(v) for k, v in runs.items()}
    print(f"whole replays ({stat} ms): " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in got.items()))
    print(f"plait / ORT: before {got['before'] / got['ORT']:.3f}, after {got['after'] / got['ORT']:.3f}")
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
