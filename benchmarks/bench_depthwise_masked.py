"""mobilenet_v2's twin on the `cpu` device before and after the masked in-place depthwise kernel (plait_dw_masked) and
batch norm at inference as one scale and shift, in one process: kernel by kernel in turn (thread CPU time, fewest of
--repeats, run it with one thread), or with --wall whole replays in turn beside ONNX Runtime on the same weights
(wall time, medians over --rounds, PLAIT_NUM_THREADS threads for plait and ORT alike, so load from other jobs falls
on all three alike).

"before" undoes the changes named by --undo: `dw` picks the depthwise kernel as gemm_c.dw_kernel did before the
masked kernel (strided layers across the vector lanes, stride-1 rows of 10-28 outputs in flat runs, narrower rows and
planes up to 56x56 across the lanes, wider ones row by row); `bn` traces batch norm with running statistics as
(x - mean) * rsqrt(var + eps) * weight + bias, four operands in the convolution's epilogue. "after" is the code as
it is.

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_depthwise_masked.py --batch 1 --undo dw
    OMP_WAIT_POLICY=PASSIVE PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_depthwise_masked.py --wall --batch 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

import plait.nn.functional as F
from plait import Tensor
from plait.codegen import gemm_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_depthwise_c import built_with
from bench_onnx import export, twin
from bench_onnx_kernels import interleaved_kernel_times, report
from bench_team_barrier import scheduling


def before_rule(win: Any) -> str:
    """gemm_c.dw_kernel before the masked kernel."""
    if win.sh > 1 or win.sw > 1:
        return "lanes"
    if gemm_c.DW_FLAT_ROWS[0] <= win.ow < gemm_c.DW_FLAT_ROWS[1]:
        return "flat"
    return "lanes" if win.ow < 16 or win.oh * win.ow <= gemm_c.DW_LANES_MAX else "rows"


def four_operand_bn(
    x: Tensor,
    mean: Tensor,
    var: Tensor,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch norm with running statistics as F.batch_norm traced it before the scale-and-shift form."""
    assert not training, "the twin runs in eval mode"
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(*shape)) * (var.reshape(*shape) + eps).sqrt().reciprocal()
    out = out * weight.reshape(*shape) if weight is not None else out
    return out + bias.reshape(*shape) if bias is not None else out


def plans(x: np.ndarray, undo: set[str]) -> dict[str, tuple[Any, np.ndarray]]:
    """The twin's plan and output for `x`, before (the changes in `undo` undone) and after."""

    def build() -> tuple[Any, np.ndarray]:
        f = twin("mobilenet_v2", "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y

    saved = F.batch_norm
    F.batch_norm = four_operand_bn if "bn" in undo else saved
    try:
        before = built_with(before_rule if "dw" in undo else gemm_c.dw_kernel, build)
    finally:
        F.batch_norm = saved
    return {"before": before, "after": build()}


def kernels(x: np.ndarray, repeats: int, undo: set[str]) -> None:
    """Both plans kernel by kernel, then each depthwise kernel side by side."""
    built = plans(x, undo)
    times = interleaved_kernel_times({k: p for k, (p, _) in built.items()}, repeats)
    for label, per in times.items():
        report(f"  {label}", per, 0)
    print("| depthwise kernel | before ms | after ms |")
    print("| --- | --- | --- |")
    for (t0, name), (t1, _) in zip(times["before"], times["after"], strict=True):
        if name.startswith("DWCONV"):
            print(f"| {name.rsplit('_', 1)[0]} | {t0 * 1e3:.3f} | {t1 * 1e3:.3f} |")


def wall(x: np.ndarray, rounds: int, undo: set[str], fifo: bool) -> None:
    """Whole replays of both plans (taking turns) and then ORT's run, per round; medians and quartiles. With
    `fifo` every thread of the process times at SCHED_FIFO priority 1 (root only: other jobs do not preempt it)."""
    built = plans(x, undo)
    threads = int(os.environ.get("PLAIT_NUM_THREADS", "1"))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(export("mobilenet_v2"), opts, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    for label, (_, y) in built.items():
        np.testing.assert_allclose(y, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()), err_msg=label)
    fns = {label: plan.run for label, (plan, _) in built.items()}
    fns["ORT"] = lambda: sess.run(None, {"x": x})
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(2):  # warm-up
        for fn in fns.values():
            fn()
    if fifo:
        scheduling(os.SCHED_FIFO, 1)
    try:
        for r in range(rounds):
            # the two plans take turns going first; ORT runs last, then a pause (its pool spins on after a run)
            for label in [*["before", "after"][:: 1 if r % 2 else -1], "ORT"]:
                t0 = time.perf_counter()
                fns[label]()
                samples[label].append((time.perf_counter() - t0) * 1e3)
                time.sleep(0.1 if label == "ORT" else 0.02)
    finally:
        if fifo:
            scheduling(os.SCHED_OTHER, 0)
    print(f"{threads} threads, {rounds} rounds, ms: median (p25-p75)")
    for label, v in samples.items():
        p25, p50, p75 = np.percentile(v, [25, 50, 75])
        print(f"  {label:7s} {p50:8.2f} ({p25:.2f}-{p75:.2f})  / ORT {p50 / np.median(samples['ORT']):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=20, help="kernel launches per kernel; the fewest counts")
    ap.add_argument("--wall", action="store_true", help="whole replays beside ONNX Runtime instead")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--fifo", action="store_true", help="--wall: time at SCHED_FIFO priority 1 (root only)")
    ap.add_argument("--undo", default="dw,bn", help="the changes 'before' undoes: dw, bn or both (comma-separated)")
    args = ap.parse_args()
    print(f"mobilenet_v2 b{args.batch}, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())} at the start")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    undo = set(args.undo.split(","))
    if not undo <= {"dw", "bn"}:
        ap.error(f"--undo takes dw and/or bn, got {args.undo}")
    if args.wall:
        wall(x, args.rounds, undo, args.fifo)
    else:
        kernels(x, args.repeats, undo)
    print(f"load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
