"""plait against ONNX Runtime at one thread in thread CPU time, for hosts whose hypervisor steals time.

Stolen time is not charged to a thread, so on a host with steal (this project's 2-core VM lost 5-37% of its time in
some minutes) the fewest thread-CPU milliseconds of a one-thread run rank plait and ORT more steadily than wall
time does. For each model the script builds the exported ONNX file in ORT (one intra-op thread, sequential: the
work runs on the calling thread) and in `plait.onnx`, plus plait's twin, checks their outputs against ORT's, and
times them in rotating order in one process. Run it with PLAIT_NUM_THREADS=1 (plait's team is then the calling
thread). To compare two revisions, run it from each tree in turn (`git archive REV | tar -x -C DIR`, then
`cd DIR && PLAIT_NUM_THREADS=1 python /path/to/this/script.py ...`: the tree in the working directory is imported).

    PLAIT_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_onnx_thread_time.py \\
        --models resnet50,mobilenet_v2 --batch 1 --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

sys.path.insert(0, os.getcwd())

import numpy as np
import onnxruntime as ort

from benchmarks.bench_onnx import export, twin
from plait.onnx import InferenceSession


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2,resnet18")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if os.environ.get("PLAIT_NUM_THREADS") != "1":
        sys.exit("set PLAIT_NUM_THREADS=1: thread CPU time counts only the calling thread")
    for name in args.models.split(","):
        model = export(name)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        ref = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        sess = InferenceSession(model, device="cpu")
        own = twin(name, "cpu")
        x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
        fns: dict[str, Callable[[], Any]] = {
            "onnx": partial(sess.run, None, {"x": x}),
            "twin": partial(own, x),
            "ort": partial(ref.run, None, {"x": x}),
        }
        want = np.asarray(fns["ort"]()[0])
        for k, got in (("onnx", fns["onnx"]()[0]), ("twin", fns["twin"]())):
            err = float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())
            if err > 1e-4:
                sys.exit(f"{name}: {k} differs from ONNX Runtime by {err:.1e} of its largest output; not timed")
        times: dict[str, list[float]] = {k: [] for k in fns}
        names = list(fns)
        for r in range(args.rounds):
            for k in names[r % 3 :] + names[: r % 3]:
                t0 = time.thread_time()
                fns[k]()
                times[k].append((time.thread_time() - t0) * 1e3)
        few = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{name} b{args.batch}: fewest thread-CPU ms ONNX {few['onnx']:.2f}, twin {few['twin']:.2f}, "
            f"ORT {few['ort']:.2f}; ONNX / ORT {few['onnx'] / few['ort']:.3f} [median {med['onnx'] / med['ort']:.3f}], "
            f"twin / ORT {few['twin'] / few['ort']:.3f} [median {med['twin'] / med['ort']:.3f}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
