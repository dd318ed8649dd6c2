"""Per-layer time of 3x3 stride-1 convolutions on an OpenCL device: the implicit GEMM against Winograd F(2,3)
(plait/codegen/winograd_cl.py), each kernel timed on its own by the device's profiling events.

Each layer (conv + bias + ReLU, random weights that are plan constants, as in a jit'ed model) is compiled with
PLAIT_WINOGRAD_CL=off and =2 and replayed; the median of `--reps` event times per kernel counts. The Winograd row
splits into its input transform, the 16 products (one batched GEMM) and the output transform; the constant
weight transform runs once at plan build and is not part of a replay. The ratios are what `winograd_cl.pick`'s
'auto' thresholds are drawn from.

    tools/gpu-run.sh python3 benchmarks/bench_winograd_cl.py --device opencl:0 --batch 64
    python3 benchmarks/bench_winograd_cl.py --device opencl:0 --batch 2 --layers 64x64x14 128x128x7
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

import plait
import plait.nn.functional as F
from plait import settings
from plait.runtime import get_device

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_winograd import LAYERS  # the same 3x3 stride-1 layers as the cpu's per-layer benchmark


def _kernel_times(device: str, c: int, k: int, hw: int, batch: int, mode: str, reps: int) -> list[tuple[str, float]]:
    """(kernel kind, median seconds) of each launch of the layer's plan under PLAIT_WINOGRAD_CL=`mode`."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, hw, hw)).astype(np.float32)
    w = plait.tensor((rng.standard_normal((k, c, 3, 3)) * 0.05).astype(np.float32), device=device)
    b = plait.tensor(rng.standard_normal(k).astype(np.float32), device=device)
    with settings.override(PLAIT_WINOGRAD_CL=mode):
        f = plait.jit(lambda t: F.conv2d(t, w, b, padding=1).relu(), device=device)
        plan = f.plan_for([x])[0]
    f(x)
    dev: Any = get_device(device)
    out = []
    for kernel, launch in zip(plan.kernels, plan.launches, strict=True):
        times = [dev.time_launch(launch) for _ in range(reps)]
        out.append((kernel.name.split("_")[0], statistics.median(times)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--layers", nargs="*", help="CxKxHW, e.g. 64x64x56 (default: resnet and vgg16 layers)")
    args = ap.parse_args()
    layers = [tuple(int(v) for v in s.split("x")) for s in args.layers] if args.layers else LAYERS
    print(f"{get_device(args.device).info.name}, batch {args.batch}, median of {args.reps} event times (ms)")
    print("| C | K | HxW | implicit GEMM | Winograd (in + products + out) | GEMM / Winograd |")
    print("|---|---|---|---|---|---|")
    for c, k, hw in layers:
        off = _kernel_times(args.device, c, k, hw, args.batch, "off", args.reps)
        on = _kernel_times(args.device, c, k, hw, args.batch, "2", args.reps)
        t_off, t_on = sum(t for _, t in off), sum(t for _, t in on)
        parts = " + ".join(f"{t * 1e3:.3f}" for _, t in on)
        print(
            f"| {c} | {k} | {hw}x{hw} | {t_off * 1e3:.3f} | {t_on * 1e3:.3f} ({parts}) | {t_off / t_on:.2f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
