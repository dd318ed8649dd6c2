"""CPU time of one plan replay of a benchmark CNN exported to ONNX (as benchmarks/bench_onnx.py exports it) and run
by plait.onnx on the `cpu` device, kernel by kernel, summed per kind of kernel, measured with `time.thread_time`.

Run with one thread so each kernel runs on the calling thread and thread CPU time counts only its own cycles, which
keeps numbers comparable on a machine that other jobs share (wall times there swing by tens of percent):

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_onnx_kernels.py alexnet --batch 16

--twin also reports plait's own twin of the net on the same weights (bench_onnx.twin), kernel for kernel the same
way; the plans' replays take turns, so that load from other jobs falls on both alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from plait.onnx import InferenceSession

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu_kernels import by_kind
from bench_onnx import MODELS, export, twin


def interleaved_kernel_times(plans: dict[str, Any], repeats: int) -> dict[str, list[tuple[float, str]]]:
    """Per plan (each has run once): (fastest thread CPU seconds of `repeats` launches, kernel name) per kernel. The
    plans take turns kernel by kernel (the i-th kernel of each, in an order that alternates per repeat), so a burst of
    load from other jobs falls on matching kernels of every plan alike."""
    best = {label: [float("inf")] * len(p.kernels) for label, p in plans.items()}
    labels = list(plans)
    for r in range(repeats):
        for i in range(max(len(p.launches) for p in plans.values())):
            for label in labels if (r + i) % 2 == 0 else labels[::-1]:
                launches = plans[label].launches
                if i < len(launches):
                    t0 = time.thread_time()
                    launches[i]()
                    best[label][i] = min(best[label][i], time.thread_time() - t0)
    return {label: [(t, k.name) for t, k in zip(best[label], p.kernels, strict=True)] for label, p in plans.items()}


def report(title: str, per: list[tuple[float, str]], top: int) -> None:
    total, count = by_kind(per)
    kinds = ", ".join(f"{k} {count[k]} {v * 1e3:.1f}" for k, v in total.most_common())
    print(f"{title}: {sum(total.values()) * 1e3:.1f} ms cpu, {len(per)} kernels: {kinds}")
    for t, name in sorted(per, reverse=True)[:top]:
        print(f"  {t * 1e3:8.2f} ms  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="launches per kernel; the fastest counts")
    ap.add_argument("--top", type=int, default=0, help="also list this many of the slowest kernels")
    ap.add_argument("--twin", action="store_true", help="also report plait's own twin of the net")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    sess = InferenceSession(export(args.model), device="cpu")
    sess.run(None, {"x": x})  # builds the plan and runs it once, so every kernel reads real data
    plans = {"ONNX": sess.plan_for({"x": x})}
    if args.twin:
        f = twin(args.model, "cpu")
        f(x)
        plans["twin"] = f.plan_for([x])[0]
    for label, per in interleaved_kernel_times(plans, args.repeats).items():
        report(f"{args.model} b{args.batch} ({label})", per, args.top)


if __name__ == "__main__":
    main()
