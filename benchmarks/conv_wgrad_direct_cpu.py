"""One-thread CPU time of a convolution's weight gradient on the cpu: the direct kernel (plait/graph/ops/
conv_wgrad_c.py: dy read in place, patch rows gathered from the image) against the folded form it replaces (im2col
of the patch columns, dy copied to (Co, N*P), then the GEMM `nn.functional._conv_vjp` picks), on resnet18's layers
at batch 16. Process CPU time, best of `--reps` (the machine is shared).

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 python benchmarks/conv_wgrad_direct_cpu.py --layers 0,1
"""

from __future__ import annotations

import argparse
import time

import numpy as np

# n, c, h, co, k, stride, padding: resnet18's convolutions at batch 16 (each distinct shape once)
LAYERS = [
    (16, 3, 224, 64, 7, 2, 3),
    (16, 64, 56, 64, 3, 1, 1),
    (16, 64, 56, 128, 3, 2, 1),
    (16, 128, 28, 128, 3, 1, 1),
    (16, 128, 28, 256, 3, 2, 1),
    (16, 256, 14, 256, 3, 1, 1),
    (16, 256, 14, 512, 3, 2, 1),
    (16, 512, 7, 512, 3, 1, 1),
    (16, 64, 56, 128, 1, 2, 0),
]


def best_cpu_ms(plan: object, reps: int) -> float:
    times = []
    for _ in range(reps):
        c = time.process_time()
        plan.run()  # type: ignore[attr-defined]
        times.append(time.process_time() - c)
    return min(times) * 1e3


def main() -> None:
    import plait
    import plait.nn.functional as F
    from plait.graph import autodiff
    from plait.schedule.plan import Plan

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default=",".join(str(i) for i in range(len(LAYERS))))
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for i in (int(v) for v in args.layers.split(",")):
        n, c, h, co, k, s, p = LAYERS[i]
        x_np = rng.standard_normal((n, c, h, h)).astype(np.float32)
        w_np = rng.standard_normal((co, c, k, k)).astype(np.float32)
        oh = (h + 2 * p - k) // s + 1
        g_np = rng.standard_normal((n, co, oh, oh)).astype(np.float32)
        plans = {}
        for form in ("direct", "folded"):
            saved = F.conv_wgrad_c.supports
            if form == "folded":
                F.conv_wgrad_c.supports = lambda node, win: False
            try:
                x = plait.Tensor.from_numpy(x_np, device="cpu")
                w = plait.tensor(w_np, device="cpu", requires_grad=True)
                g = plait.Tensor.from_numpy(g_np, device="cpu")
                loss = (F.conv2d(x, w, None, s, p) * g).sum()
                seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
                grads = autodiff.gradients(loss.node, seed, [w.node])
                # the gradient alone: its kernels read x and dy (g), nothing of the forward
                plans[form] = Plan([grads[w.node.uid]])
            finally:
                F.conv_wgrad_c.supports = saved
            plans[form].run()
        gflop = 2 * n * co * c * k * k * oh * oh / 1e9
        td, tf = best_cpu_ms(plans["direct"], args.reps), best_cpu_ms(plans["folded"], args.reps)
        kinds = {f: [kk.name.split("_")[0] for kk in pl.kernels] for f, pl in plans.items()}
        print(
            f"{co}x{c}x{k}x{k}/{s} over {n}x{oh}x{oh}: direct {td:.2f} ms ({gflop / td * 1e3:.1f} GFLOP/s) {kinds['direct']}, "
            f"folded {tf:.2f} ms ({gflop / tf * 1e3:.1f} GFLOP/s) {kinds['folded']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
