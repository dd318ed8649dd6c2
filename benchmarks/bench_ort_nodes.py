"""ONNX Runtime's time per node for a benchmark CNN exported as benchmarks/bench_onnx.py exports it (CPU provider,
--threads intra-op threads (default one), ORT's own node profiler), grouped the way plait's kernels are: depthwise
convolutions, pointwise (1x1) convolutions, other convolutions, and the rest by op type (--nodes: then every node).
Each node's time is its fastest over --runs runs, which on a machine that other jobs share is the closest to its
unloaded time; set beside benchmarks/bench_onnx_kernels.py (plait's kernels, one thread, fastest of --repeats) it
says layer kind by layer kind where plait stands.

    .venv/bin/python benchmarks/bench_ort_nodes.py mobilenet_v2 --batch 1
    .venv/bin/python benchmarks/bench_ort_nodes.py resnet50 --threads 2 --nodes
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export


def node_kind(args: dict[str, object]) -> str:
    """depthwise / pointwise / conv for convolutions (from the weight's shape: [Co, Ci/groups, kh, kw] against the
    input's channels, in either NCHW or ORT's blocked NCHWc layout), else the op type."""
    op = str(args.get("op_name", "?"))
    if "Conv" not in op:
        return op
    shapes = args.get("input_type_shape", [])
    dims = [next(iter(s.values())) for s in shapes] if isinstance(shapes, list) else []
    if len(dims) < 2 or len(dims[1]) != 4:
        return op
    x, w = dims[0], dims[1]
    if w[1] == 1 and w[0] > 1 and (len(x) < 2 or x[1] * (x[4] if len(x) == 5 else 1) >= w[0]):
        return "depthwise"
    if w[2] == 1 and w[3] == 1:
        return "pointwise"
    return "conv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="ORT's intra-op threads")
    ap.add_argument("--nodes", action="store_true", help="then every node: kind, input and weight shapes, fastest ms")
    args = ap.parse_args()
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(export(args.model), so, providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
        for _ in range(args.runs):
            sess.run(None, {"x": x})
        events = json.loads(Path(sess.end_profiling()).read_text())
    best: dict[str, float] = {}
    kinds: dict[str, str] = {}
    shapes: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not str(e.get("name", "")).endswith("_kernel_time"):
            continue
        name = e["name"]
        best[name] = min(best.get(name, float("inf")), e["dur"] / 1e3)
        kinds[name] = node_kind(e.get("args", {}))
        shp = e.get("args", {}).get("input_type_shape", [])
        shapes[name] = " ".join(str(next(iter(d.values()))) for d in shp[:2]) if isinstance(shp, list) else ""
    total: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for name, t in best.items():
        total[kinds[name]] += t
        count[kinds[name]] += 1
    print(
        f"{args.model} b{args.batch}: ONNX Runtime {ort.__version__}, {args.threads} thread(s), {sum(best.values()):.1f} ms in nodes"
    )
    for kind, t in total.most_common():
        print(f"  {kind:12s} {count[kind]:4d} {t:8.2f} ms")
    if args.nodes:
        for name, t in best.items():
            print(f"  {t:7.3f} ms  {kinds[name]:10s} {shapes[name]}  {name.removesuffix('_kernel_time')}")


if __name__ == "__main__":
    main()
