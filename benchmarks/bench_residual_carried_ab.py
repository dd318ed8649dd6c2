"""A/B of the residual carried in C's storage (plan.Plan._carried) on a benchmark CNN's twin, in one process.

Plan A is built with `Plan._carried` returning nothing (every GEMM reads its residual in the epilogue, as before),
plan B as the tree builds it (GEMMs whose residual dies with them take its storage and add the product to it). The
outputs are checked against each other and ONNX Runtime; then the kernels of the GEMMs B carries a residual in are
launched in turn against A's same kernels (one thread: fewest thread CPU ms; more: median wall ms; note that such a
launch keeps adding to C, which changes no timing), and last whole replays of A and B alternate with ORT's, the
order of A and B reversed every round. Load and the host's steal share are printed with the replays.

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_residual_carried_ab.py resnet50 --batch 16
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("PLAIT_NUM_THREADS", "1"))
os.environ.setdefault("PLAIT_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

import numpy as np
import onnxruntime as ort

from plait.schedule.plan import Plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin
from bench_residual_inplace import steal_ticks


def build(model: str, x: np.ndarray, carry: bool) -> tuple[Any, np.ndarray]:
    """(plan, output) of the twin, with or without residuals carried in C."""
    saved = Plan._carried
    if not carry:
        Plan._carried = lambda self, *args: {}  # type: ignore[method-assign]
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y
    finally:
        Plan._carried = saved  # type: ignore[method-assign]


def carried_kernels(pa: Any, pb: Any, repeats: int, threads: int) -> tuple[float, float, int]:
    """Seconds of A's and B's kernels at the launches where B carries a residual (launched in turn), and how many."""
    at = [i for i, item in enumerate(pb.launched) if "carried" in item.extra]
    clock = time.thread_time if threads == 1 else time.perf_counter
    pick = min if threads == 1 else (lambda v: float(np.median(v)))
    ta, tb = 0.0, 0.0
    for i in at:
        got: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(repeats):
            for label, plan in (("A", pa), ("B", pb)) if r % 2 == 0 else (("B", pb), ("A", pa)):
                t0 = clock()
                plan.launches[i]()
                got[label].append(clock() - t0)
        ta, tb = ta + pick(got["A"]), tb + pick(got["B"])
    return ta, tb, len(at)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10, help="launches of each carried kernel")
    ap.add_argument("--rounds", type=int, default=20, help="whole replays of each plan and of ORT")
    args = ap.parse_args()
    threads = int(os.environ["PLAIT_NUM_THREADS"])
    print(f"{args.model} b{args.batch}, {threads} thread(s), load {os.getloadavg()}")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    (pa, ya), (pb, yb) = build(args.model, x, False), build(args.model, x, True)
    assert len(pa.launches) == len(pb.launches)
    np.testing.assert_allclose(yb, ya, rtol=1e-4, atol=1e-4)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(export(args.model), opts, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], yb, rtol=1e-3, atol=1e-3)
    fns = {"A": pa.run, "B": pb.run, "ORT": lambda: sess.run(None, {"x": x})}
    for fn in fns.values():
        fn()
    stat = "fewest thread CPU" if threads == 1 else "median wall"
    ta, tb, count = carried_kernels(pa, pb, args.repeats, threads)
    print(f"  the {count} carried GEMMs ({stat} ms, summed): A {ta * 1e3:.2f} -> B {tb * 1e3:.2f} ({tb / ta:.3f})")
    clock = time.thread_time if threads == 1 else time.perf_counter
    times: dict[str, list[float]] = {k: [] for k in fns}
    s0, w0 = steal_ticks(), time.perf_counter()
    for r in range(args.rounds):
        for label in ("A", "B", "ORT") if r % 2 == 0 else ("B", "A", "ORT"):
            t0 = clock()
            fns[label]()
            times[label].append(clock() - t0)
        time.sleep(0.05)
    steal = (steal_ticks() - s0) / (100 * (os.cpu_count() or 1) * (time.perf_counter() - w0))
    pick = min if threads == 1 else (lambda v: float(np.median(v)))
    got = {k: pick(v) * 1e3 for k, v in times.items()}
    rounds = float(np.median(np.array(times["B"]) / np.array(times["A"])))
    print(f"whole replays ({stat} ms): " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()))
    print(
        f"plait / ORT: A {got['A'] / got['ORT']:.3f}, B {got['B'] / got['ORT']:.3f}; B / A {got['B'] / got['A']:.3f}, "
        f"median per round {rounds:.3f}; load at the end {os.getloadavg()}, steal {steal:.1%}"
    )


if __name__ == "__main__":
    main()
