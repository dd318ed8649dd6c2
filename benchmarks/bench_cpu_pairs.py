"""Every convolution of a benchmark CNN, ONNX Runtime's node beside plait's kernel, one thread each, in network order.

ONNX Runtime runs the exported model with its node profiler (CPU provider, one intra-op thread: its NCHWc graph,
activations and adds fused into the convolutions); plait runs its twin's plan (same weights) kernel by kernel. The
n-th convolution node of ORT's graph is paired with the n-th convolution kernel of plait's plan (GEMM, CONV, WINO,
DWCONV, GEMV kinds; both keep the network's order), so each row says where one layer stands. ORT's times are the
fewest microseconds of wall time over --runs runs, plait's the fewest thread CPU seconds over as many whole replays:
run it on a quiet machine (the load average is printed).

    .venv/bin/python benchmarks/bench_cpu_pairs.py mobilenet_v2 --batch 16 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PLAIT_NUM_THREADS", "1")

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin

CONV_KINDS = ("GEMM", "CONV", "WINO2", "WINO4", "DWCONV", "GEMV", "PWLANES", "S2CONV")


def ort_nodes(name: str, x: np.ndarray, runs: int) -> list[tuple[str, float]]:
    """(op and output shape, fewest ms) of every Conv / Gemm / FusedConv node, in the order the graph runs them."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(export(name), opts, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        sess.run(None, {"x": x})
    best: dict[str, tuple[float, str]] = {}
    order: list[str] = []
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        args = e.get("args", {})
        op = str(args.get("op_name", ""))
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or ("Conv" not in op and "Gemm" not in op):
            continue
        shape = next(iter(args["output_type_shape"][0].values()))
        if e["name"] not in best:
            order.append(e["name"])
        old = best.get(e["name"], (float("inf"), ""))
        best[e["name"]] = (min(old[0], e["dur"] / 1e3), f"{op} {'x'.join(map(str, shape))}")
    return [(best[n][1], best[n][0]) for n in order]


def plait_kernels(name: str, x: np.ndarray, runs: int) -> tuple[list[tuple[str, float]], float]:
    """(kernel name, fewest ms inside whole replays) of the convolution kernels, and all kernels' summed ms."""
    f = twin(name, "cpu")
    plan, _ = f.plan_for([x])
    f(x)
    best = [float("inf")] * len(plan.launches)
    for _ in range(runs):
        for i, launch in enumerate(plan.launches):
            t0 = time.thread_time()
            launch()
            best[i] = min(best[i], time.thread_time() - t0)
    convs = [(k.name, 1e3 * t) for k, t in zip(plan.kernels, best, strict=True) if k.name.split("_")[0] in CONV_KINDS]
    return convs, 1e3 * sum(best)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    load = " ".join(f"{v:.1f}" for v in os.getloadavg())
    print(f"{args.model} b{args.batch}, load average {load}")
    x = np.random.default_rng(1).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    ort_rows = ort_nodes(args.model, x, args.runs)
    plait_rows, plait_all = plait_kernels(args.model, x, args.runs)
    print("| # | ORT node | ORT ms | plait kernel | plait ms | plait / ORT |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i in range(max(len(ort_rows), len(plait_rows))):
        on, ot = ort_rows[i] if i < len(ort_rows) else ("-", float("nan"))
        pn, pt = plait_rows[i] if i < len(plait_rows) else ("-", float("nan"))
        print(f"| {i} | {on} | {ot:.2f} | {pn.rsplit('_', 1)[0]} | {pt:.2f} | {pt / ot:.2f} |")
    print(
        f"convolutions: ORT {sum(t for _, t in ort_rows):.1f} ms, plait {sum(t for _, t in plait_rows):.1f} ms;"
        f" all plait kernels {plait_all:.1f} ms; load average at the end"
        f" {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
    )


if __name__ == "__main__":
    main()
