"""Tile contractions against PyTorch CPU and NumPy, in one run on the same data: a 3x3 conv2d (stride 1, pad 1)
and a square matmul, forward, on every usable device. Outputs are checked against PyTorch before timing.

    .venv/bin/python benchmarks/bench_tile.py [--devices cpu opencl:0] [--batch 4] [--channels 64] [--size 32] [--n 512]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch

import plait
from plait.bench.timing import measure
from plait.runtime import get_device
from plait.runtime.discovery import usable_devices
from plait.tile import lib


def conv_numpy(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3, stride 1, pad 1 convolution as im2col (sliding windows) + tensordot."""
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))  # N, C, H, W, KH, KW
    return np.einsum("nchwij,ocij->nohw", win, w, optimize=True)


def row(name: str, ms: float, flops: float, ref_ms: float) -> str:
    return f"| {name} | {ms:.2f} | {flops / ms / 1e6:.1f} | {ref_ms / ms:.2f}x |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--devices", nargs="*", default=None)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    nb, c, s, n = args.batch, args.channels, args.size, args.n
    x = rng.standard_normal((nb, c, s, s), dtype=np.float32)
    w = rng.standard_normal((c, c, 3, 3), dtype=np.float32) * 0.1
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    conv_flops = 2 * nb * c * c * s * s * 9
    mm_flops = 2 * n**3
    tx, tw, ta, tb = (torch.from_numpy(v) for v in (x, w, a, b))
    with torch.no_grad():
        ref_conv = torch.nn.functional.conv2d(tx, tw, padding=1).numpy()
        t_torch_conv = measure(lambda: torch.nn.functional.conv2d(tx, tw, padding=1), iters=args.iters)["median_ms"]
        t_torch_mm = measure(lambda: ta @ tb, iters=args.iters)["median_ms"]
    assert np.allclose(conv_numpy(x, w), ref_conv, rtol=1e-3, atol=1e-3)
    t_np_conv = measure(lambda: conv_numpy(x, w), iters=args.iters)["median_ms"]
    t_np_mm = measure(lambda: a @ b, iters=args.iters)["median_ms"]
    print(
        f"# {time.strftime('%Y-%m-%d')} on {platform.node()} ({platform.processor() or platform.machine()}): "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), numpy {np.__version__}, float32, "
        f"median of up to {args.iters} runs after 2 warm-ups"
    )
    print(f"# conv2d: x ({nb}, {c}, {s}, {s}), w ({c}, {c}, 3, 3), stride 1, padding 1; matmul: {n}x{n} @ {n}x{n}")
    print("| what | ms | GFLOP/s | vs PyTorch |")
    print("| --- | --- | --- | --- |")
    print(row("conv2d PyTorch CPU", t_torch_conv, conv_flops, t_torch_conv))
    print(row("conv2d NumPy (im2col einsum)", t_np_conv, conv_flops, t_torch_conv))
    print(row("matmul PyTorch CPU", t_torch_mm, mm_flops, t_torch_mm))
    print(row("matmul NumPy", t_np_mm, mm_flops, t_torch_mm))
    for dev in args.devices or usable_devices():
        d = get_device(dev)
        conv = plait.jit(lambda p, q: lib.conv2d(p, q, padding=1), device=dev)
        assert np.allclose(conv(x, w), ref_conv, rtol=1e-3, atol=1e-3), f"{dev}: tile conv2d differs from PyTorch"
        plan_conv, _ = conv.plan_for([x, w])
        t_conv = measure(plan_conv.run, d.synchronize, iters=args.iters)["median_ms"]
        mm = plait.jit(lambda p, q: lib.matmul(p, q), device=dev)
        assert np.allclose(mm(a, b), a @ b, rtol=1e-3, atol=1e-2), f"{dev}: tile matmul differs from NumPy"
        plan_mm, _ = mm.plan_for([a, b])
        t_mm = measure(plan_mm.run, d.synchronize, iters=args.iters)["median_ms"]
        print(row(f"conv2d tile on {dev}", t_conv, conv_flops, t_torch_conv))
        print(row(f"matmul tile on {dev}", t_mm, mm_flops, t_torch_mm))


if __name__ == "__main__":
    main()
