"""Per-layer time of the `cpu` device's 3x3 stride-1 convolutions: implicit GEMM against Winograd F(2,3) and F(4,3).

Each layer (conv + bias + ReLU, random weights, the weight a constant of the plan as in a jit'ed model) is compiled
once per PLAIT_WINOGRAD mode and replayed; the best of `--repeats` times counts (the least disturbed by other jobs
on a shared machine). With `--cpu-time` (run with PLAIT_NUM_THREADS=1) the time is the calling thread's CPU time,
which other jobs on the cores barely move. The ratios are what plait/codegen/winograd_c.py's per-layer choice is
drawn from.

    OMP_WAIT_POLICY=PASSIVE PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_winograd.py --batch 1 16
    PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_winograd.py --batch 1 --cpu-time
    PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_winograd.py --models resnet18 vgg16 --batch 1 --cpu-time

With `--models`, whole benchmark networks (plait.models, eval mode, traced under plait.no_grad as an inference
plan) are timed instead: the sum of their kernels' best times, the implicit GEMM everywhere against the per-layer
choice.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import plait
import plait.nn.functional as F
from plait import settings

# (in channels, out channels, image size): the 3x3 stride-1 layers of resnet18/34/50 and vgg16
LAYERS = [
    (64, 64, 56),
    (128, 128, 28),
    (256, 256, 14),
    (512, 512, 7),
    (64, 64, 224),
    (64, 128, 112),
    (128, 128, 112),
    (128, 256, 56),
    (256, 256, 56),
    (256, 512, 28),
    (512, 512, 28),
    (512, 512, 14),
]
MODES = ("off", "2", "4")


def _plans(c: int, k: int, hw: int, batch: int) -> list[Any]:
    """One compiled conv + bias + ReLU plan per mode, each run once on the same random input."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, c, hw, hw)).astype(np.float32)
    w = plait.tensor(rng.standard_normal((k, c, 3, 3)).astype(np.float32) * 0.05, device="cpu")
    b = plait.tensor(rng.standard_normal(k).astype(np.float32), device="cpu")
    plans = []
    for mode in MODES:
        with settings.override(PLAIT_WINOGRAD=mode):
            f = plait.jit(lambda t: F.conv2d(t, w, b, padding=1).relu(), device="cpu")
            plans.append(f.plan_for([x])[0])
        f(x)
    return plans


def _times(plans: list[Any], repeats: int, budget: float, cpu: bool) -> list[float]:
    """Best time per plan; the plans take turns, so a burst of load on the machine hits them all alike."""
    clock = time.thread_time if cpu else time.perf_counter
    best, start = [float("inf")] * len(plans), time.perf_counter()
    for _ in range(repeats):
        for i, plan in enumerate(plans):
            t0 = clock()
            plan.run()
            best[i] = min(best[i], clock() - t0)
        if time.perf_counter() - start > budget:
            break
    return best


def _model_plans(name: str, batch: int) -> list[Any]:
    """An inference plan of benchmark network `name` with PLAIT_WINOGRAD off, then with the per-layer choice."""
    import plait.nn as pnn
    from plait.models import architectures

    model = architectures.builders(pnn)[name]()
    model.eval()
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    plans = []
    for mode in ("off", "auto"):
        with settings.override(PLAIT_WINOGRAD=mode), plait.no_grad():
            f = plait.jit(lambda t: model(t), device="cpu")
            plans.append(f.plan_for([x])[0])
            f(x)
    return plans


def _kernel_sum(plans: list[Any], repeats: int, cpu: bool) -> list[tuple[float, float]]:
    """Per plan: (sum over its kernels of each kernel's best time, of which Winograd and weight-transform kernels)."""
    clock = time.thread_time if cpu else time.perf_counter
    best = [[float("inf")] * len(p.launches) for p in plans]
    for _ in range(repeats):
        for p, b in zip(plans, best, strict=True):
            for i, launch in enumerate(p.launches):
                t0 = clock()
                launch()
                b[i] = min(b[i], clock() - t0)
    out = []
    for p, b in zip(plans, best, strict=True):
        wino = sum(t for t, k in zip(b, p.kernels, strict=True) if k.name.startswith("WINO"))
        out.append((sum(b), wino))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--max-seconds", type=float, default=6.0, help="per layer")
    ap.add_argument("--max-hw", type=int, default=224, help="skip layers with larger images")
    ap.add_argument("--cpu-time", action="store_true", help="time the calling thread's CPU time (one thread)")
    ap.add_argument("--models", nargs="+", default=[], help="time whole networks instead of single layers")
    args = ap.parse_args()
    if args.models:
        print("model batch  implicit ms  per-layer choice ms (of which Winograd)  speedup")
        for name in args.models:
            for batch in args.batch:
                (off, _), (auto, wino) = _kernel_sum(_model_plans(name, batch), args.repeats, args.cpu_time)
                print(
                    f"{name} {batch} {off * 1e3:.1f} {auto * 1e3:.1f} ({wino * 1e3:.1f}) {off / auto:.2f}", flush=True
                )
        return
    print("batch  c_in c_out  hw   implicit ms   F(2,3) ms   F(4,3) ms   speedup F2  speedup F4")
    for batch in args.batch:
        for c, k, hw in LAYERS:
            if hw > args.max_hw:
                continue
            ms = [t * 1e3 for t in _times(_plans(c, k, hw, batch), args.repeats, args.max_seconds, args.cpu_time)]
            print(
                f"{batch:5d} {c:5d} {k:5d} {hw:4d} {ms[0]:12.2f} {ms[1]:11.2f} {ms[2]:11.2f}"
                f" {ms[0] / ms[1]:11.2f} {ms[0] / ms[2]:11.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
