"""ONNX Runtime alone on an exported model at two intra-op threads: how its per-call time splits into modes.

tools/cpu-issue8.sh onnx reported mobilenet_v2 b1 under ORT as bimodal (rounds of 3.5 ms and of 8.8 ms). This script
times the exported model in ORT with calls back to back, then with a pause before every call (--pauses, seconds),
and records for each call the vCPU every ORT thread of the process last ran on (/proc/self/task/*/stat field 39):
when both busy threads share one vCPU a call takes about twice as long. The load average and the hypervisor's steal
share (the 8th value of /proc/stat's cpu line) are printed with each series.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_ort_modes.py mobilenet_v2 --batch 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import export
from bench_team_steps import steal_ticks

from plait.onnx import InferenceSession


def thread_cpus() -> dict[int, tuple[int, int]]:
    """Per thread id of this process: (the vCPU it last ran on, its user+system ticks)."""
    out: dict[int, tuple[int, int]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state (field 3): field n is fields[n - 3]
        out[int(tid)] = (int(fields[36]), int(fields[11]) + int(fields[12]))
    return out


def runqueue_wait_ns() -> int:
    """Nanoseconds the threads of this process have waited on a run queue, runnable but not running
    (/proc/self/task/*/schedstat, second value): a call that ran at two-thread speed waited little."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except OSError:
            continue
    return total


def series(run: object, calls: int, pause: float) -> None:
    """Time `calls` calls of `run` with `pause` seconds before each; print the distribution and, per call, on which
    vCPUs the threads that used CPU time during it last ran."""
    s0, w0 = steal_ticks(), time.perf_counter()
    times: list[float] = []
    waits: list[float] = []  # ms on a run queue per call, all threads
    shared = 0
    for _ in range(calls):
        if pause:
            time.sleep(pause)
        before, q0 = thread_cpus(), runqueue_wait_ns()
        t0 = time.perf_counter()
        run()  # type: ignore[operator]
        times.append((time.perf_counter() - t0) * 1e3)
        waits.append((runqueue_wait_ns() - q0) / 1e6)
        after = thread_cpus()
        busy = {after[t][0] for t in after if t in before and after[t][1] > before[t][1]}
        shared += len(busy) == 1
    share = (steal_ticks() - s0) / (100 * (os.cpu_count() or 1) * (time.perf_counter() - w0))
    q = statistics.quantiles(times, n=20)
    fast = sum(t < 1.5 * min(times) for t in times)
    print(
        f"pause {pause:.2f} s, {calls} calls: min {min(times):.2f} p10 {q[1]:.2f} p25 {q[4]:.2f} median"
        f" {statistics.median(times):.2f} p75 {q[14]:.2f} p90 {q[17]:.2f} ms; within 1.5x of min {fast}/{calls};"
        f" calls whose busy threads ended on one vCPU {shared}; steal {share:.1%}; load {os.getloadavg()[0]:.2f}"
    )
    print("  first 40 ms (run-queue wait ms):", " ".join(f"{t:.1f}({w:.1f})" for t, w in zip(times[:40], waits)))
    slow = [w for t, w in zip(times, waits, strict=True) if t >= 1.5 * min(times)]
    quick = [w for t, w in zip(times, waits, strict=True) if t < 1.5 * min(times)]
    if slow and quick:
        print(
            f"  run-queue wait per call: median {statistics.median(quick):.2f} ms in the fast calls,"
            f" {statistics.median(slow):.2f} ms in the slow ones"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=60)
    ap.add_argument("--pauses", type=float, nargs="+", default=[0.0, 0.2, 1.0])
    ap.add_argument("--no-spin", action="store_true", help="session.intra_op.allow_spinning = 0")
    ap.add_argument("--plait", action="store_true", help="also plait.onnx on the same model, series interleaved")
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.inter_op_num_threads = 1
    if args.no_spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = export(args.model)
    x = np.random.default_rng(args.batch).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    runs = {"ort": partial(ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"]).run, None, {"x": x})}
    if args.plait:
        runs["plait"] = partial(InferenceSession(model, device="cpu").run, None, {"x": x})
    for run in runs.values():
        for _ in range(5):
            run()
    print(
        f"{args.model} b{args.batch}, ORT {ort.__version__}, 2 intra-op threads, spinning {not args.no_spin};"
        f" PLAIT_NUM_THREADS={os.environ.get('PLAIT_NUM_THREADS')} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}"
    )
    for pause in args.pauses:
        for name, run in runs.items():
            print(name, end=": ")
            series(run, args.calls, pause)
            time.sleep(1.0)  # ORT's spinning workers settle before the next series


if __name__ == "__main__":
    main()
