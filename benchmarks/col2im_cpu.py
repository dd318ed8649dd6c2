"""Process CPU time of the folded im2col and col2im kernels at cifar_cnn's training shapes (3x3, padding 1), one plan
per kernel, best of 5 rounds of 10 runs. Run with OMP_NUM_THREADS=1 so the number does not depend on the load of a
shared machine; point PYTHONPATH at another tree's copy of plait to time its kernels the same way.

    OMP_NUM_THREADS=1 python benchmarks/col2im_cpu.py 32
"""

import sys
import time

import numpy as np

import plait
from plait.graph.ops.conv import Window, col2im, im2col
from plait.schedule.plan import Plan

print(plait.__file__)  # which tree's kernels are timed
n = int(sys.argv[1]) if len(sys.argv) > 1 else 32

for c, hw in [(32, 32), (32, 16), (64, 16), (64, 8), (128, 8)]:
    w = Window(n, c, hw, hw, 3, 3, 1, 1, 1, 1, fold=True)
    x = plait.tensor(np.random.rand(n, c, hw, hw).astype(np.float32), device="cpu")
    cols = plait.tensor(np.random.rand(*w.cols_shape).astype(np.float32), device="cpu")
    for name, node in [("im2col", im2col(x.node, w)), ("col2im", col2im(cols.node, w))]:
        plan = Plan([node])
        plan.run()
        best = []
        for _ in range(5):
            t0 = time.process_time()
            for _ in range(10):
                plan.run()
            best.append((time.process_time() - t0) / 10 * 1e3)
        t = min(best)
        print(f"{name} c{c} {hw}x{hw}: {t:.3f} ms")
