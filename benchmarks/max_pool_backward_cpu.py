"""Process CPU time of one plan computing max_pool2d 3x3/2 padding 1 (resnet18's stem pool on a ReLU output of
(N, 64, 112, 112)) and its input gradient, best of 5 rounds of 5 runs: `direct` is what `max_pool2d` uses on the cpu
when a gradient is recorded (the pooling kernel and the gradient kernel of plait/graph/ops/pool_grad.py), `cols` the
pool over im2col columns it used before (still the form elsewhere), `old` the chain of strided views before that.

    OMP_NUM_THREADS=1 python benchmarks/max_pool_backward_cpu.py direct 4
"""

import functools
import sys
import time

import numpy as np

import plait
import plait.nn.functional as F
from plait.frontends.native.tensor import Tensor
from plait.graph import autodiff
from plait.schedule.plan import Plan

form = sys.argv[1]
n = int(sys.argv[2])
if form == "old":

    def views_pool(xp: Tensor, k: tuple[int, int], s: tuple[int, int], d: tuple[int, int]) -> Tensor:
        oh = (xp.shape[2] - d[0] * (k[0] - 1) - 1) // s[0] + 1
        ow = (xp.shape[3] - d[1] * (k[1] - 1) - 1) // s[1] + 1
        return functools.reduce(Tensor.maximum, F._windows(xp, k, s, d, (oh, ow)))

    F._max_pool_cols = views_pool
if form in ("old", "cols"):
    from plait.graph.ops import pool_grad

    pool_grad.supports = lambda node: False  # no direct kernels: the column form (or, patched above, the views)
rng = np.random.default_rng(0)
xa = np.maximum(rng.standard_normal((n, 64, 112, 112)).astype(np.float32), 0)
x = plait.tensor(xa, device="cpu", requires_grad=True)
y = F.max_pool2d(x, 3, 2, 1)
g = plait.tensor(rng.standard_normal(y.shape).astype(np.float32), device="cpu")
loss = (y * g).sum()
seed = Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
grads = autodiff.gradients(loss.node, seed, [x.node])
plan = Plan([loss.node, *grads.values()])
plan.run()
best = []
for _ in range(5):
    t0 = time.process_time()
    for _ in range(5):
        plan.run()
    best.append((time.process_time() - t0) / 5 * 1e3)
print(f"{form} n={n}: {len(plan.launches)} launches, min {min(best):.2f} ms, median {sorted(best)[2]:.2f} ms CPU")
