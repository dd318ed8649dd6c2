"""One-thread CPU time of a folded convolution's weight gradient in both orientations: dy @ columns^T (the GEMM
packs the large patch columns) and (columns @ dy^T)^T (it reads them in place and packs dy), on layer shapes of
cifar_cnn and resnet18 at batch 16. Process CPU time, best of 7 (the machine is shared).

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 python benchmarks/conv_wgrad_cpu.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

SHAPES = [(32, 288, 16384), (64, 576, 4096), (128, 1152, 1024), (32, 27, 16384), (64, 576, 12544), (512, 4608, 784)]


def best_cpu_ms(f: Callable[[], object], reps: int = 7) -> float:
    times = []
    for _ in range(reps):
        c = time.process_time()
        f()
        times.append(time.process_time() - c)
    return min(times) * 1e3


def main() -> None:
    import plait
    from plait.schedule.plan import Plan

    rng = np.random.default_rng(0)
    for co, k, kk in SHAPES:  # output channels, C*kh*kw, images x positions
        dy = plait.Tensor.from_numpy(rng.standard_normal((co, kk)).astype(np.float32), device="cpu")
        cols = plait.Tensor.from_numpy(rng.standard_normal((k, kk)).astype(np.float32), device="cpu")
        plain = Plan([(dy @ cols.transpose(0, 1)).node])
        swapped = Plan([(cols @ dy.transpose(0, 1)).transpose(0, 1).node])
        plain.run()
        swapped.run()
        mflop = 2 * co * k * kk / 1e6
        ta, tb = best_cpu_ms(plain.run), best_cpu_ms(swapped.run)
        print(
            f"{co}x{k} over K {kk}: dy @ cols^T {ta:.2f} ms ({mflop / ta:.1f} GFLOP/s), "
            f"(cols @ dy^T)^T {tb:.2f} ms ({mflop / tb:.1f} GFLOP/s)"
        )


if __name__ == "__main__":
    main()
