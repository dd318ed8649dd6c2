"""The ONNX path before and after small pooling windows became one fused chain, beside plait's own twin and ONNX
Runtime, timed in turn round by round in one process (bench_onnx.measure_rounds) so that load from other jobs falls
on all four alike. "before" is a session imported with plait.onnx.ops.nn.CHAIN_MAX_CELLS = 0, which sends every
pool through the separable reductions the importer used until then.

    OMP_WAIT_POLICY=PASSIVE PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/onnx_pools_before_after.py \\
        --models resnet18 alexnet --batches 1 16 --iters 10

--kernels instead reports one-thread CPU time per kind of kernel of the three plait plans, their kernels' launches
taking turns (bench_onnx_kernels.interleaved_kernel_times); run it with OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

import plait.onnx.ops.nn as onnx_nn
from plait.onnx import InferenceSession

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, measure_rounds, twin
from bench_onnx_kernels import interleaved_kernel_times, report


def _session(model: bytes, feed: dict[str, np.ndarray], chain_cells: int) -> InferenceSession:
    """A session whose plan for `feed` was imported with pools of up to `chain_cells` cells as chains."""
    saved = onnx_nn.CHAIN_MAX_CELLS
    onnx_nn.CHAIN_MAX_CELLS = chain_cells
    try:
        sess = InferenceSession(model, device="cpu")
        sess.plan_for(feed)  # the graph is imported here, under the setting above
    finally:
        onnx_nn.CHAIN_MAX_CELLS = saved
    return sess


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--kernels", action="store_true", help="one-thread CPU time per kind of kernel instead")
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(os.environ.get("PLAIT_NUM_THREADS", "2"))
    opts.inter_op_num_threads = 1
    print(f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if not args.kernels:
        print("| model | batch | ONNX before ms | ONNX after ms | twin ms | ORT ms | after / twin | after / ORT |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        model = export(name)
        ref = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        own = twin(name, "cpu")
        for batch in args.batches:
            x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
            feed = {"x": x}
            want = ref.run(None, feed)[0]
            before, after = _session(model, feed, 0), _session(model, feed, onnx_nn.CHAIN_MAX_CELLS)
            fns = {
                "before": partial(before.run, None, feed),
                "after": partial(after.run, None, feed),
                "twin": partial(own, x),
                "ort": partial(ref.run, None, feed),
            }
            for label in ("before", "after", "twin"):
                got = np.asarray(fns[label]()[0] if label != "twin" else fns[label]())
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
            if args.kernels:  # every plan has run, so each kernel reads real data
                plans = {"before": before.plan_for(feed), "after": after.plan_for(feed), "twin": own.plan_for([x])[0]}
                for label, per in interleaved_kernel_times(plans, args.iters).items():
                    report(f"{name} b{batch} ({label})", per, 0)
                continue
            t = {k: v["median_ms"] for k, v in measure_rounds(fns, args.iters, args.max_seconds).items()}
            print(
                f"| {name} | {batch} | {t['before']:.1f} | {t['after']:.1f} | {t['twin']:.1f} | {t['ort']:.1f}"
                f" | {t['after'] / t['twin']:.2f} | {t['after'] / t['ort']:.2f} |",
                flush=True,
            )
    print(f"load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
