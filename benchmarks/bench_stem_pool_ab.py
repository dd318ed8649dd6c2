"""The stem and its max pool as one kernel (plait/codegen/stem_pool_c.py) against the two kernels they were, inside
whole replays of a benchmark CNN's twin: the same twin built twice, once with the scheduler's `_stem_pool` pass
and once without, whole replays alternating (order reversed every round), each launch timed by the calling
thread's CPU time (one thread) or wall time (more). Prints, per plan, the median and fewest ms of the stem and pool
(the fused kernel, or the stem's and the pool's kernels summed) and the whole replay's median, with the load and
the hypervisor's steal share over the run. With --ort, ONNX Runtime (CPU provider, as many intra-op threads, its
node profiler) runs the exported model as many rounds in between, and its first Conv node and first MaxPool node
(fewest ms each) are printed beside plait's (fewest) for the same batch:

    PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_stem_pool_ab.py resnet18 --batch 1 --rounds 21 --ort
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("PLAIT_NUM_THREADS", "1"))
os.environ.setdefault("PLAIT_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

import numpy as np
import onnxruntime as ort

from plait.bench.env import cpu_ticks, steal_text
from plait.schedule import scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin


def build(model: str, x: np.ndarray, fused: bool) -> tuple[object, np.ndarray, list[int]]:
    """(plan, output, indices of the stem's and pool's kernels) of the twin with or without the fusion pass."""
    keep = scheduler._stem_pool
    if not fused:
        scheduler._stem_pool = lambda items, outputs: items  # type: ignore[assignment]
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        plan = f.plan_for([x])[0]
    finally:
        scheduler._stem_pool = keep  # type: ignore[assignment]
    names = [k.name for k in plan.kernels]  # type: ignore[attr-defined]
    if fused:
        at = [i for i, k in enumerate(plan.kernels) if "plait_conv_dlpool_" in k.source]  # type: ignore[attr-defined]
    else:
        stem = next(i for i, k in enumerate(plan.kernels) if "plait_conv_d" in k.source)  # type: ignore[attr-defined]
        at = [stem, next(i for i, n in enumerate(names) if i > stem and n.startswith("POOL"))]
    assert at, names
    return plan, y, at


def ort_stem(model: str, x: np.ndarray, rounds: int, threads: int) -> tuple[float, float]:
    """ONNX Runtime's fewest ms of the first Conv (the stem, its ReLU fused) and the first MaxPool node."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(export(model), opts, providers=["CPUExecutionProvider"])
    for _ in range(rounds):
        sess.run(None, {"x": x})
    first: dict[str, str] = {}
    best: dict[str, float] = {}
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        op = str(e.get("args", {}).get("op_name", ""))
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        kind = "pool" if op == "MaxPool" else "conv" if "Conv" in op else ""
        if kind and first.setdefault(kind, e["name"]) == e["name"]:
            best[kind] = min(best.get(kind, float("inf")), e["dur"] / 1e3)
    return best["conv"], best["pool"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--ort", action="store_true", help="ONNX Runtime's stem and pool nodes as well")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans = {}
    ref = None
    for name, fused in (("fused", True), ("two kernels", False)):
        plan, y, at = build(args.model, x, fused)
        ref = y if ref is None else ref
        assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max(), f"{name}: output differs"
        plans[name] = (plan, at)
    one = os.environ["PLAIT_NUM_THREADS"] == "1"
    clock = time.thread_time if one else time.perf_counter
    part: dict[str, list[float]] = {k: [] for k in plans}
    whole: dict[str, list[float]] = {k: [] for k in plans}
    ticks = cpu_ticks()
    for r in range(args.rounds + 1):
        for name in list(plans) if r % 2 == 0 else list(plans)[::-1]:
            plan, at = plans[name]
            times = []
            for launch in plan.launches:  # type: ignore[attr-defined]
                c0 = clock()
                launch()
                times.append(clock() - c0)
            if r:
                part[name].append(sum(times[i] for i in at) * 1e3)
                whole[name].append(sum(times) * 1e3)
    lost = steal_text(ticks, cpu_ticks())
    print(
        f"{args.model} b{args.batch}, {os.environ['PLAIT_NUM_THREADS']} thread(s), load {os.getloadavg()[0]:.2f}, "
        f"steal {lost}"
    )
    if args.ort:
        conv, pool = ort_stem(args.model, x, args.rounds, int(os.environ["PLAIT_NUM_THREADS"]))
        print(f"  ORT          stem {conv:.3f} + pool {pool:.3f} = {conv + pool:.3f} ms fewest")
    for name in plans:
        p, w = part[name], whole[name]
        print(
            f"  {name:12s} stem + pool median {statistics.median(p):7.3f} fewest {min(p):7.3f} ms;"
            f" whole replay median {statistics.median(w):8.2f} ms"
        )


if __name__ == "__main__":
    main()
