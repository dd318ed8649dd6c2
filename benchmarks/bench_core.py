"""Foundation benchmark: a 1024^3 float32 matmul and a 16M-element fused elementwise chain on each usable
device, as GFLOP/s and GB/s and as ratios to NumPy measured in the same run.

    .venv/bin/python benchmarks/bench_core.py [--devices cpu opencl:0] [--n 1024] [--elems 16777216]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

import plait
from plait.bench.timing import measure
from plait.runtime import get_device
from plait.runtime.discovery import usable_devices


def chain_np(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.maximum(x * 1.5 + y, 0.0) * np.tanh(y) - x / (1.0 + np.abs(y))


def chain_plait(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
    return (x * 1.5 + y).relu() * y.tanh() - x / (1.0 + y.abs())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--devices", nargs="*", default=None)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--elems", type=int, default=1 << 24)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.n
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    x = rng.standard_normal(args.elems, dtype=np.float32)
    y = rng.standard_normal(args.elems, dtype=np.float32)
    flops = 2 * n**3
    nbytes = 3 * 4 * args.elems  # two reads, one write
    t_np_mm = measure(lambda: a @ b, iters=10)["median_ms"]
    t_np_ew = measure(lambda: chain_np(x, y), iters=5)["median_ms"]
    print(f"# {time.strftime('%Y-%m-%d')} on {platform.node()}: numpy {np.__version__}")
    print(f"numpy   matmul {n}^3: {t_np_mm:8.2f} ms {flops / t_np_mm / 1e6:8.1f} GFLOP/s")
    print(f"numpy   chain {args.elems}: {t_np_ew:8.2f} ms {nbytes / t_np_ew / 1e6:8.1f} GB/s")
    print("| device | matmul ms | GFLOP/s | vs NumPy | chain ms | GB/s | vs NumPy | kernels in chain |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for dev in args.devices or usable_devices():
        d = get_device(dev)
        mm = plait.jit(lambda p, q: p @ q, device=dev)
        got = mm(a, b)
        assert np.allclose(got, a @ b, rtol=1e-3, atol=1e-2), f"{dev}: matmul differs from NumPy"
        plan_mm, _ = mm.plan_for([a, b])
        t_mm = measure(lambda p=plan_mm, d=d: (p.run(), d.synchronize()), iters=10)["median_ms"]
        ew = plait.jit(chain_plait, device=dev)
        assert np.allclose(ew(x, y), chain_np(x, y), rtol=1e-4, atol=1e-5), f"{dev}: chain differs from NumPy"
        plan_ew, _ = ew.plan_for([x, y])
        t_ew = measure(lambda p=plan_ew, d=d: (p.run(), d.synchronize()), iters=5)["median_ms"]
        print(
            f"| {dev} ({d.info.name}) | {t_mm:.2f} | {flops / t_mm / 1e6:.1f} | {t_np_mm / t_mm:.2f}x | "
            f"{t_ew:.2f} | {nbytes / t_ew / 1e6:.1f} | {t_np_ew / t_ew:.2f}x | {len(plan_ew.kernels)} |"
        )


if __name__ == "__main__":
    main()
