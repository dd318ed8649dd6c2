"""CPU time of the C GEMM per register tile on the pointwise (1x1, stride-1) convolution products of mobilenet_v2 and
resnet50, the table behind `gemm_c.pick_tile`.

A 1x1 stride-1 convolution is a plain product: A the (Co, Ci) weight read in place, B the (Ci, H*W) image plane.
Each product is rendered with every candidate tile (knobs MR, NR), compiled, and launched `--repeats` times on the
calling thread; the best `time.thread_time` counts, which keeps cells comparable on a machine other jobs share:

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_tiles_c.py --model mobilenet_v2
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from plait.codegen import gemm, gemm_c
from plait.runtime import get_device

# (Co, Ci, H*W) of each distinct pointwise stride-1 layer
SHAPES = {
    "mobilenet_v2": [
        (16, 32, 12544),
        (96, 16, 12544),
        (24, 96, 3136),
        (144, 24, 3136),
        (24, 144, 3136),
        (32, 144, 784),
        (192, 32, 784),
        (32, 192, 784),
        (64, 192, 196),
        (384, 64, 196),
        (64, 384, 196),
        (96, 384, 196),
        (576, 96, 196),
        (96, 576, 196),
        (160, 576, 49),
        (960, 160, 49),
        (160, 960, 49),
        (320, 960, 49),
        (1280, 320, 49),
    ],
    "resnet50": [
        (64, 64, 3136),
        (256, 64, 3136),
        (64, 256, 3136),
        (128, 256, 3136),
        (512, 128, 784),
        (128, 512, 784),
        (256, 512, 784),
        (1024, 256, 196),
        (256, 1024, 196),
        (512, 1024, 196),
        (2048, 512, 49),
        (512, 2048, 49),
    ],
}
TILES = [(24, 1), (16, 1), (12, 2), (8, 3), (6, 4), (4, 6)]


def spec_of(co: int, ci: int, hw: int, batch: int) -> gemm.GemmSpec:
    """The GemmSpec that conv2d's 1x1 stride-1 path gives the scheduler: one product per image, A shared."""
    return gemm.GemmSpec(batch, co, hw, ci, (0, 0, ci, 1), (0, ci * hw, hw, 1))


def time_tile(dev: object, spec: gemm.GemmSpec, knobs: dict[str, int], repeats: int) -> float:
    """Best thread CPU time in ms of one launch of `spec` rendered with `knobs`, A and B random normal values: on the
    allocator's leftover bytes (possibly denormals) one 8x48 kernel took 1.10 ms against 1.73 on random data in the
    same run (docs/benchmarks.md, "resnet50's residual epilogue and B packing")."""
    k = gemm.render_c(spec, knobs)
    rng = np.random.default_rng(0)
    a = dev.allocator.alloc(4 * spec.m * spec.k)  # type: ignore[attr-defined]
    b = dev.allocator.alloc(4 * spec.batch * spec.k * spec.n)  # type: ignore[attr-defined]
    c = dev.allocator.alloc(4 * spec.batch * spec.m * spec.n)  # type: ignore[attr-defined]
    for buf in (a, b):
        dev.allocator.copy_in(buf, rng.standard_normal(buf.nbytes // 4).astype(np.float32))  # type: ignore[attr-defined]
    launch = dev.compile(k.source, k.name).bind([c, a, b], k.global_size, k.local_size)  # type: ignore[attr-defined]
    launch()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        launch()
        best = min(best, time.thread_time() - t0)
    for buf in (a, b, c):
        dev.allocator.free(buf.nbytes, buf.handle)  # type: ignore[attr-defined]
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=SHAPES, nargs="+", default=list(SHAPES))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tiles", default="", help="MRxNV list, e.g. 24x1,8x3 (default: all candidates)")
    args = ap.parse_args()
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")] if args.tiles else TILES
    dev = get_device("cpu")
    print("Co Ci HW " + " ".join(f"{mr}x{nv * gemm_c.VW}" for mr, nv in tiles) + " heuristic best")
    for model in args.model:
        for co, ci, hw in SHAPES[model]:
            spec = spec_of(co, ci, hw, args.batch)
            ms = [time_tile(dev, spec, {"MR": mr, "NR": nv * gemm_c.VW}, args.repeats) for mr, nv in tiles]
            merged = hw * args.batch if args.batch > 1 and hw < gemm_c.MERGE_BELOW else hw
            mr, nv = gemm_c.pick_tile(co, merged)
            best = min(range(len(tiles)), key=ms.__getitem__)
            gf = 2 * args.batch * co * ci * hw / ms[best] / 1e6
            cells = " ".join(f"{t:.3f}" for t in ms)
            print(f"{co} {ci} {hw} {cells} {mr}x{nv * gemm_c.VW} {tiles[best][0]}x{tiles[best][1] * gemm_c.VW}", end="")
            print(f" ({gf:.0f} GFLOP/s)", flush=True)


if __name__ == "__main__":
    main()
