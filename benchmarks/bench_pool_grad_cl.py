"""The max-pool gradient kernel (POOLGRAD, plait/graph/ops/pool_cl.py) alone on an OpenCL device, for the training
pools of alexnet (3x3/2 at 55, 27 and 13) and resnet's stem (3x3/2 padding 1 at 112) at one batch: the pool's
forward and gradient in one plan with the input and output gradient as plan inputs, each POOLGRAD launch timed by
the device's profiling events (median of --reps), the gradient checked exactly against PyTorch's.

    tools/gpu-run.sh python3 benchmarks/bench_pool_grad_cl.py --batch 64
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait import dtypes
from plait.graph import autodiff
from plait.graph.node import Node
from plait.schedule.plan import Plan
from plait.schedule.profile import profile_plan

POOLS = {  # name: (channels, side, kernel, stride, padding)
    "alexnet 55": (64, 55, 3, 2, 0),
    "alexnet 27": (192, 27, 3, 2, 0),
    "alexnet 13": (256, 13, 3, 2, 0),
    "resnet stem": (64, 112, 3, 2, 1),
}


def _one(device: str, batch: int, geo: tuple[int, int, int, int, int], reps: int) -> tuple[float, bool]:
    """The POOLGRAD kernel time (s) of one pool and whether its gradient equals PyTorch's bit for bit."""
    c, side, k, s, p = geo
    rng = np.random.default_rng(0)
    xa = rng.standard_normal((batch, c, side, side)).astype(np.float32)
    oh = (side + 2 * p - k) // s + 1
    ga = rng.standard_normal((batch, c, oh, oh)).astype(np.float32)
    nodes = [Node("input", (), None, a.shape, dtypes.float32, device) for a in (xa, ga)]
    nodes[0].rg = True
    x, g = (plait.Tensor(n) for n in nodes)
    loss = (F.max_pool2d(x, k, s, p) * g).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    dx = autodiff.gradients(loss.node, seed, [x.node])[x.node.uid]
    plan = Plan([dx], nodes)
    (got,) = plan(xa, ga)
    xt = torch.tensor(xa, requires_grad=True)
    (torch.nn.functional.max_pool2d(xt, k, s, p) * torch.tensor(ga)).sum().backward()
    assert xt.grad is not None
    exact = bool(np.array_equal(got, xt.grad.numpy()))
    report = profile_plan(plan, reps=reps)
    return sum(st.time_s for st in report.kernels if st.name.startswith("POOLGRAD")), exact


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    print(f"POOLGRAD at batch {args.batch}, median of {args.reps} events (ms)")
    print("| pool | channels x side, kernel/stride/padding | POOLGRAD ms | gradient equals torch's |")
    print("|---|---|---|---|")
    for name, geo in POOLS.items():
        t, exact = _one(args.device, args.batch, geo, args.reps)
        c, side, k, s, p = geo
        print(f"| {name} | {c}x{side}, {k}/{s}/{p} | {t * 1e3:.4f} | {exact} |", flush=True)


if __name__ == "__main__":
    main()
