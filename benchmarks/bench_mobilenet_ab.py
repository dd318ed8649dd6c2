"""mobilenet_v2's plan on the `cpu` device with and without the session's pointwise and depthwise kernel choices, in one
process, kernel by kernel in turn (bench_onnx_kernels), one thread, thread CPU time, fewest of --repeats: a before and
after that a shared machine's load hits alike.

"before" renders the plan with the streaming pointwise product off (pointwise_c.MAX_ROWS = 0: the packed GEMM), every
stride-1 depthwise layer up to 56x56 or with rows under 16 across the vector lanes and wider ones row by row (the rule
before gemm_c.dw_kernel's flat runs), and no prefetch of small planes in the lanes kernel; "after" is the code as it
is. Prints both plans' totals per kind of kernel and every kernel whose time differs by more than --show percent.

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_mobilenet_ab.py --batch 16 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from plait.codegen import gemm_c, pointwise_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import twin
from bench_onnx_kernels import interleaved_kernel_times, report


def before_rule(win: Any) -> str:
    """The depthwise kernel choice before the flat runs: strided layers, rows under 16 and planes up to 56x56 across
    the lanes, wider planes row by row."""
    if win.sh > 1 or win.sw > 1 or win.ow < 16 or win.oh * win.ow <= gemm_c.DW_LANES_MAX:
        return "lanes"
    return "rows"


def build(x: np.ndarray, before: bool) -> Any:
    """The twin's plan for `x`, rendered as before the session's kernel choices or as the code is."""
    saved = pointwise_c.MAX_ROWS, gemm_c.dw_kernel, gemm_c.DEPTHWISE
    if before:
        pointwise_c.MAX_ROWS = 0
        gemm_c.dw_kernel = before_rule
        gemm_c.DEPTHWISE = gemm_c.DEPTHWISE.replace("PLAIT_DW_PREFETCH = 256", "PLAIT_DW_PREFETCH = 0")
    try:
        f = twin("mobilenet_v2", "cpu")
        f(x)
        return f.plan_for([x])[0]
    finally:
        pointwise_c.MAX_ROWS, gemm_c.dw_kernel, gemm_c.DEPTHWISE = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--show", type=float, default=5.0, help="list kernels whose times differ by more than this %%")
    args = ap.parse_args()
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans = {"before": build(x, True), "after": build(x, False)}
    times = interleaved_kernel_times(plans, args.repeats)
    print(f"mobilenet_v2 b{args.batch}, load average {load} at the start")
    for label, per in times.items():
        report(f"  {label}", per, 0)
    print("| kernel | before ms | after ms |")
    print("| --- | --- | --- |")
    for (t0, name), (t1, _) in zip(times["before"], times["after"], strict=True):
        if abs(t1 - t0) > args.show / 100 * t0:
            print(f"| {name.rsplit('_', 1)[0]} | {t0 * 1e3:.3f} | {t1 * 1e3:.3f} |")
    print(f"load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
