"""The cpu GEMM library alone on resnet50's 1x1 product shapes and one square one: fewest thread CPU time of 15 runs of
3 calls each, operands hot in cache, GFLOP/s, checked against NumPy. Run on one thread to compare with one core's
peak; --knobs forces a register tile (MR, NR) instead of the heuristic's:

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_gemm_speed.py [--knobs '{"MR": 6, "NR": 16}']
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from plait.codegen import gemm, gemm_c
from plait.runtime import get_device

SHAPES = [(64, 3136, 256), (256, 3136, 64), (128, 784, 512), (512, 784, 128), (256, 196, 1024), (1024, 196, 256)]
SHAPES += [(512, 49, 2048), (2048, 49, 512), (512, 512, 512)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--knobs", default="{}", help='GEMM knobs as JSON, e.g. \'{"MR": 6, "NR": 16}\'')
    knobs = json.loads(ap.parse_args().knobs)
    dev = get_device("cpu")
    al = dev.allocator
    print(f"vector width {gemm_c.VW}, tiles {gemm_c.TILES}, knobs {knobs}")
    rng = np.random.default_rng(0)
    for m, n, k in SHAPES:
        spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, 0, n, 1))
        kern = gemm.render_c(spec, knobs)
        a, b = rng.random((m, k), dtype=np.float32), rng.random((k, n), dtype=np.float32)
        bufs = [al.alloc(4 * m * n), al.alloc(a.nbytes), al.alloc(b.nbytes)]
        al.copy_in(bufs[1], a)
        al.copy_in(bufs[2], b)
        run = dev.compile(kern.source, kern.name).bind(bufs, kern.global_size, kern.local_size)
        run()
        out = np.empty((1, m, n), np.float32)
        al.copy_out(bufs[0], out)
        want = a.astype(np.float64) @ b
        err = float(np.abs(out[0] - want).max() / np.abs(want).max())
        if err > 1e-4:
            raise SystemExit(f"{m}x{n}x{k}: relative error {err:.1e} against NumPy")
        best = float("inf")
        for _ in range(15):
            t0 = time.thread_time()
            run()
            run()
            run()
            best = min(best, (time.thread_time() - t0) / 3)
        print(f"{m}x{n}x{k}: {best * 1e3:.3f} ms, {2 * m * n * k / best / 1e9:.1f} GFLOP/s")
        for buf in bufs:
            al.free(buf.nbytes, buf.handle)


if __name__ == "__main__":
    main()
