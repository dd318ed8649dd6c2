"""The image stems (conv + bias + ReLU over 3 input channels, constant weights) on plait's cpu device: the direct
kernel's pixel-vector form (plait_conv_direct), its lanes form with each given register tile (plait_conv_dlanes_*)
and ONNX Runtime's one-node model, timed in turn in one process so that load from other jobs falls on all alike.

With one thread (the default) each replay is timed by the calling thread's CPU time; with --threads 2 (plait's
team and ORT's intra-op pool) by wall time. Prints the median and the fewest ms per variant and checks every
plait variant against torch:

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_stem_c.py --tiles 4x6 2x12 --batch 1 --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--layers", nargs="+", default=["alexnet", "resnet"], help="alexnet, resnet, vgg16, mobilenet_v2")
ap.add_argument("--tiles", nargs="+", default=["4x5"], help="lanes tiles CVxPX[:weight bytes per pass]")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--rounds", type=int, default=15)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--no-ort", action="store_true")
args = ap.parse_args()
os.environ["OMP_NUM_THREADS"] = os.environ["PLAIT_NUM_THREADS"] = str(args.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import plait  # noqa: E402
import plait.nn.functional as F  # noqa: E402
from plait.codegen import gemm_c  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cpu_layers  # noqa: E402

# (in channels, out channels, kernel, stride, padding, input height, input width) as bench_cpu_layers.Layer
STEMS = {
    "alexnet": (3, 64, 11, 4, 2, 224, 224),
    "resnet": (3, 64, 7, 2, 3, 224, 224),
    "vgg16": (3, 64, 3, 1, 1, 224, 224),
    "mobilenet_v2": (3, 32, 3, 2, 1, 224, 224),
}


def plait_stem(layer: tuple[int, ...], x: np.ndarray, w: np.ndarray, b: np.ndarray, spec: str | None):
    """One replay of the stem's plan built with the lanes tile `spec` (CVxPX[:weight bytes per pass]; None: the
    pixel-vector form), and its output."""
    _, _, _, s, p, _, _ = layer
    shape, _, kcb = (spec or "").partition(":")
    tile = tuple(int(v) for v in shape.split("x")) if spec else None
    keep, keep_kcb = gemm_c.direct_lanes, gemm_c.DIRECT_LANES_KC_BYTES
    gemm_c.direct_lanes = lambda win, m, k: tile  # type: ignore[assignment]
    gemm_c.DIRECT_LANES_KC_BYTES = int(kcb) if kcb else keep_kcb
    try:
        wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
        f = plait.jit(lambda t: F.conv2d(t, wt, bt, stride=s, padding=p).relu(), device="cpu")
        plan, _ = f.plan_for([x])
        out = np.asarray(f(x))
    finally:
        gemm_c.direct_lanes, gemm_c.DIRECT_LANES_KC_BYTES = keep, keep_kcb  # type: ignore[assignment]
    sources = " ".join(k.source for k in plan.kernels)
    form = "plait_conv_direct(" if tile is None else f"plait_conv_dlanes_{shape}("
    assert form in sources, f"{form} not in the plan"
    return (lambda: [launch() for launch in plan.launches]), out


def main() -> None:
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    for name in args.layers:
        layer = STEMS[name]
        cin, cout, k, s, p, h, wd = layer
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.batch, cin, h, wd)).astype(np.float32)
        w = (rng.standard_normal((cout, cin, k, k)) * 0.1).astype(np.float32)
        b = rng.standard_normal(cout).astype(np.float32)
        want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), s, p).relu()
        fns: dict[str, Callable[[], object]] = {}
        for t in [None, *args.tiles]:
            label = "pixel vectors" if t is None else f"lanes {t}"
            fn, out = plait_stem(layer, x, w, b, t)
            err = float(np.abs(out - want.numpy()).max() / np.abs(want.numpy()).max())
            assert err < 1e-5, f"{name} {label}: max error {err:.2e}"
            fns[label] = fn
        if not args.no_ort:
            sess = ort_layer(layer, x, w, b, args.threads)
            fns["ORT"] = lambda sess=sess, x=x: sess.run(None, {"x": x})
        times: dict[str, list[float]] = {label: [] for label in fns}
        for fn in fns.values():
            fn()
        for r in range(args.rounds):
            order = list(fns.items()) if r % 2 == 0 else list(reversed(fns.items()))
            for label, fn in order:
                t0 = clock()
                fn()
                times[label].append((clock() - t0) * 1e3)
        print(f"{name} b{args.batch} {args.threads} thread(s), load {os.getloadavg()[0]:.2f}:")
        for label, ts in times.items():
            print(f"  {label:16s} median {statistics.median(ts):8.3f} ms  best {min(ts):8.3f} ms")


def ort_layer(layer: tuple[int, ...], x: np.ndarray, w: np.ndarray, b: np.ndarray, threads: int) -> Any:
    """bench_cpu_layers.ort_layer's Conv + Relu session with `threads` intra-op threads."""
    import onnxruntime as ort

    def session(model: bytes) -> Any:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])

    keep = bench_cpu_layers.ort_session
    bench_cpu_layers.ort_session = session
    try:
        return bench_cpu_layers.ort_layer(layer, x, w, b)  # type: ignore[arg-type]
    finally:
        bench_cpu_layers.ort_session = keep


if __name__ == "__main__":
    main()
