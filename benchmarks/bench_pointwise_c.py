"""The streaming pointwise product (plait/codegen/pointwise_c.py) against the packed GEMM inside whole plans of plait's
mobilenet_v2 twin on the `cpu` device: one plan built with the pointwise kernel off (pointwise_c.MAX_ROWS = 0), one
as it is, their kernels launched in turn (bench_onnx_kernels), one thread, thread CPU time, fewest of --repeats.
Prints each product the pointwise kernel runs, both ways, and both plans' totals.

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_pointwise_c.py --batch 16 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from plait.codegen import pointwise_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import twin
from bench_onnx_kernels import interleaved_kernel_times


def build(x: np.ndarray, rows: int) -> Any:
    """The twin's plan for `x` with pointwise_c.MAX_ROWS set to `rows` while its kernels are rendered."""
    saved = pointwise_c.MAX_ROWS
    pointwise_c.MAX_ROWS = rows
    try:
        f = twin("mobilenet_v2", "cpu")
        f(x)
        return f.plan_for([x])[0]
    finally:
        pointwise_c.MAX_ROWS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    print(f"mobilenet_v2 b{args.batch}, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans = {"packed": build(x, 0), "pointwise": build(x, pointwise_c.MAX_ROWS)}
    times = interleaved_kernel_times(plans, args.repeats)
    print("| product | packed GEMM ms | pointwise ms |")
    print("| --- | --- | --- |")
    for (t_packed, name), (t_pw, _), kernel in zip(
        times["packed"], times["pointwise"], plans["pointwise"].kernels, strict=True
    ):
        if "plait_pointwise_" in kernel.source:
            print(f"| {name.rsplit('_', 1)[0]} | {t_packed * 1e3:.3f} | {t_pw * 1e3:.3f} |")
    totals = {label: 1e3 * sum(t for t, _ in per) for label, per in times.items()}
    print(f"all kernels: packed {totals['packed']:.1f} ms, pointwise {totals['pointwise']:.1f} ms")


if __name__ == "__main__":
    main()
