"""CPU time of each depthwise convolution layer of mobilenet_v2 on the `cpu` device (DWCONV kernels with the
inference epilogue: batch norm and ReLU6), for stride-1 layers the plane-by-plane kernels (row by row, and in
64-output runs across the rows) against the one that runs 16 planes across the vector lanes (strided layers only run
across the lanes), one thread, `time.thread_time` per launch, best of --repeats.

The kernels of a layer are built in one process (gemm_c.dw_kernel replaced by a constant while the plan is built)
and launched in turn, so all see the same load on a machine that other jobs share.

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_depthwise_c.py --batch 1

--plan does the same for whole plans of plait's mobilenet_v2 twin (bench_onnx.twin), one built with every stride-1
depthwise layer across the vector lanes and one as gemm_c.dw_kernel picks, their kernels launched in turn
(bench_onnx_kernels), and prints each plan's CPU time per kind of kernel.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import twin
from bench_onnx_kernels import interleaved_kernel_times, report

# (channels, input height = width, stride, how many layers of mobilenet_v2 have it)
LAYERS = [
    (32, 112, 1, 1),
    (96, 112, 2, 1),
    (144, 56, 1, 1),
    (144, 56, 2, 1),
    (192, 28, 1, 2),
    (192, 28, 2, 1),
    (384, 14, 1, 4),
    (576, 14, 1, 2),
    (576, 14, 2, 1),
    (960, 7, 1, 3),
]


def layer_launch(batch: int, c: int, hw: int, stride: int, kind: str) -> tuple[Callable[[], None], np.ndarray]:
    """The one DWCONV launch of a depthwise + BN + ReLU6 layer built with the kernel `kind` (lanes, flat or rows;
    a strided layer always runs across the lanes), and its output."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, hw, hw)).astype(np.float32)
    w = plait.tensor(rng.standard_normal((c, 1, 3, 3)).astype(np.float32), device="cpu")
    scale = plait.tensor(rng.standard_normal((c, 1, 1)).astype(np.float32), device="cpu")
    shift = plait.tensor(rng.standard_normal((c, 1, 1)).astype(np.float32), device="cpu")

    def fn(t: plait.Tensor) -> plait.Tensor:
        return (F.conv2d(t, w, None, stride, 1, 1, c) * scale + shift).clip(0.0, 6.0)

    def build() -> tuple[Any, np.ndarray]:
        jit = plait.jit(fn, device="cpu")
        plan, _ = jit.plan_for([x])
        return plan, np.asarray(jit(x))

    plan, out = built_with(lambda win: "lanes" if stride > 1 else kind, build)
    (kernel,) = plan.kernels
    assert kernel.name.startswith("DWCONV"), kernel.name
    (launch,) = plan.launches
    return launch, out


def built_with(pick: Callable[[Any], str], build: Callable[[], Any]) -> Any:
    """What `build` returns with gemm_c.dw_kernel replaced by `pick` while it runs (plans render their kernels when
    they are built)."""
    saved = gemm_c.dw_kernel
    gemm_c.dw_kernel = pick
    try:
        return build()
    finally:
        gemm_c.dw_kernel = saved


def compare_plans(batch: int, repeats: int) -> None:
    """Whole mobilenet_v2 twin plans, every depthwise layer across the vector lanes against the default pick,
    kernels timed in turn; then each depthwise layer's time in both plans, side by side."""
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)

    def build() -> Any:
        f = twin("mobilenet_v2", "cpu")
        f(x)
        return f.plan_for([x])[0]

    plans = {"lanes": built_with(lambda win: "lanes", build), "default": built_with(gemm_c.dw_kernel, build)}
    times = interleaved_kernel_times(plans, repeats)
    for label, per in times.items():
        report(f"mobilenet_v2 b{batch} ({label})", per, 0)
    print("| depthwise kernel | lanes ms | default ms |")
    print("| --- | --- | --- |")
    for (t_lanes, name), (t_pick, _) in zip(times["lanes"], times["default"], strict=True):
        if name.startswith("DWCONV"):
            print(f"| {name.rsplit('_', 1)[0]} | {t_lanes * 1e3:.3f} | {t_pick * 1e3:.3f} |")


def layer_row(
    batch: int, c: int, hw: int, stride: int, repeats: int
) -> tuple[float | None, float | None, float, float]:
    """(row-by-row ms and flat ms, None for a strided layer, which only the lanes kernel runs; lanes ms; the default
    pick's ms, the masked kernel's where it picks that) of one layer, the kernels launched in turn and their outputs
    checked against each other."""
    lanes, out = layer_launch(batch, c, hw, stride, "lanes")
    launches = [lanes]
    if stride == 1:
        for kind in ("rows", "flat", "masked"):
            plane, ref = layer_launch(batch, c, hw, stride, kind)
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
            launches.append(plane)
    best = [float("inf")] * len(launches)
    for _ in range(repeats):
        for i, launch in enumerate(launches):
            t0 = time.thread_time()
            launch()
            best[i] = min(best[i], time.thread_time() - t0)
    if stride > 1:
        return None, None, best[0] * 1e3, best[0] * 1e3
    win = SimpleNamespace(h=hw, w=hw, kh=3, kw=3, sh=1, sw=1, oh=hw, ow=hw)
    pick = {"lanes": best[0], "rows": best[1], "flat": best[2], "masked": best[3]}[gemm_c.dw_kernel(win)]
    return best[1] * 1e3, best[2] * 1e3, best[0] * 1e3, pick * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--plan", action="store_true", help="compare whole mobilenet_v2 plans instead of single layers")
    args = ap.parse_args()
    if args.plan:
        compare_plans(args.batch, args.repeats)
        return
    print(f"batch {args.batch}, ms per layer (best of {args.repeats}); default: the kernel gemm_c.dw_kernel picks")
    print("| channels | input | stride | layers | rows | flat | lanes | default |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    total = 0.0
    for c, hw, stride, count in LAYERS:
        rows, flat, lanes, pick = layer_row(args.batch, c, hw, stride, args.repeats)
        total += pick * count
        shown = " | ".join("-" if v is None else f"{v:.3f}" for v in (rows, flat))
        print(f"| {c} | {hw}x{hw} | {stride} | {count} | {shown} | {lanes:.3f} | {pick:.3f} |")
    print(f"\nthe 17 layers as picked: {total:.2f} ms")


if __name__ == "__main__":
    main()
