"""A/B of the cpu GEMM's library (plait/codegen/gemm_c.py: micro-kernel `_micro`, task loop `_driver`, packing
`COMMON`, epilogue prefetch `epi_prefetch`) at an older commit against the working tree, side by side in one process
on a benchmark CNN's twin.

Plan A renders its GEMM and implicit-GEMM kernels with REV's `_micro`, `_driver`, `COMMON` and `epi_prefetch` (read
with `git show`; none where REV has none), plan B with the tree's; the outputs are checked, then (unless
--no-kernels) the kernels are launched in turn, kernel by kernel, and summed per kind (one thread: fewest thread
CPU ms; more: median wall ms). Last, whole replays of A and B alternate with ONNX Runtime's run of the exported
model (same weights), the order of A and B reversed every round.
--fifo runs every thread at SCHED_FIFO priority 1 while timing (root only).

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_gemm_rev_ab.py resnet50 --rev deded71
    OMP_WAIT_POLICY=PASSIVE PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_gemm_rev_ab.py resnet50 --fifo
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("PLAIT_NUM_THREADS", "1"))
os.environ.setdefault("PLAIT_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

import numpy as np
import onnxruntime as ort

from plait.codegen import gemm_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin
from bench_onnx_kernels import interleaved_kernel_times
from bench_team_barrier import scheduling

ROOT = Path(__file__).resolve().parent.parent


def old_gemm_c(rev: str) -> types.ModuleType:
    """plait/codegen/gemm_c.py as it was at `rev`, as a module of its own."""
    src = subprocess.check_output(["git", "-C", str(ROOT), "show", f"{rev}:plait/codegen/gemm_c.py"], text=True)
    mod = types.ModuleType("gemm_c_old")
    exec(compile(src, f"{rev}:gemm_c.py", "exec"), mod.__dict__)
    return mod


def build(model: str, x: np.ndarray, old: types.ModuleType | None) -> tuple[Any, np.ndarray]:
    """(plan, output) of the twin, its GEMMs rendered with `old`'s micro-kernel, driver, packing and epilogue
    prefetch when given."""
    saved = gemm_c._micro, gemm_c._driver, gemm_c.COMMON, gemm_c.epi_prefetch
    if old is not None:
        gemm_c._micro, gemm_c._driver, gemm_c.COMMON = old._micro, old._driver, old.COMMON
        gemm_c.epi_prefetch = getattr(old, "epi_prefetch", lambda names, m, n: "")
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y
    finally:
        gemm_c._micro, gemm_c._driver, gemm_c.COMMON, gemm_c.epi_prefetch = saved


def kernel_sums(plans: dict[str, Any], repeats: int, threads: int) -> dict[str, dict[str, float]]:
    """Seconds per kernel kind, per plan: kernels launched in turn (the i-th of each plan, order alternating)."""
    if threads == 1:
        per = interleaved_kernel_times(plans, repeats)
    else:
        walls: dict[str, list[list[float]]] = {k: [[] for _ in p.launches] for k, p in plans.items()}
        labels = list(plans)
        for r in range(repeats):
            for i in range(len(plans[labels[0]].launches)):
                for label in labels if (r + i) % 2 == 0 else labels[::-1]:
                    t0 = time.perf_counter()
                    plans[label].launches[i]()
                    walls[label][i].append(time.perf_counter() - t0)
        per = {k: [(float(np.median(w)), kn.name) for w, kn in zip(walls[k], p.kernels)] for k, p in plans.items()}
    sums: dict[str, dict[str, float]] = {}
    for label, rows in per.items():
        for t, name in rows:
            kind = name.split("_")[0]
            sums.setdefault(kind, {}).setdefault(label, 0.0)
            sums[kind][label] += t
    return sums


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rev", default="HEAD", help="the commit whose GEMM micro-kernel and driver plan A uses")
    ap.add_argument("--repeats", type=int, default=10, help="launches of each kernel")
    ap.add_argument("--rounds", type=int, default=20, help="whole replays of each plan and of ORT")
    ap.add_argument("--no-kernels", action="store_true")
    ap.add_argument("--fifo", action="store_true")
    args = ap.parse_args()
    threads = int(os.environ["PLAIT_NUM_THREADS"])
    print(f"{args.model} b{args.batch}, {threads} thread(s), A = {args.rev}, load {os.getloadavg()}")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    (pa, ya), (pb, yb) = build(args.model, x, old_gemm_c(args.rev)), build(args.model, x, None)
    np.testing.assert_allclose(yb, ya, rtol=1e-5, atol=1e-5)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(export(args.model), opts, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], yb, rtol=1e-3, atol=1e-3)
    fns = {"A": pa.run, "B": pb.run, "ORT": lambda: sess.run(None, {"x": x})}
    for fn in fns.values():
        fn()
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    try:
        if not args.no_kernels:
            stat = "fewest thread CPU" if threads == 1 else "median wall"
            for kind, t in kernel_sums({"A": pa, "B": pb}, args.repeats, threads).items():
                print(f"  {kind} kernels ({stat} ms): {t['A'] * 1e3:.2f} -> {t['B'] * 1e3:.2f} ({t['B'] / t['A']:.3f})")
        clock = time.thread_time if threads == 1 else time.perf_counter
        times: dict[str, list[float]] = {k: [] for k in fns}
        for r in range(args.rounds):
            for label in ("A", "B", "ORT") if r % 2 == 0 else ("B", "A", "ORT"):
                t0 = clock()
                fns[label]()
                times[label].append(clock() - t0)
            time.sleep(0.05)
    finally:
        if args.fifo:
            scheduling(os.SCHED_OTHER, 0)
    pick = min if threads == 1 else (lambda v: float(np.median(v)))
    got = {k: pick(v) * 1e3 for k, v in times.items()}
    rounds = float(np.median(np.array(times["B"]) / np.array(times["A"])))
    stat = "fewest thread CPU" if threads == 1 else "median wall"
    print(f"whole replays ({stat} ms): " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()))
    print(
        f"plait / ORT: A {got['A'] / got['ORT']:.3f}, B {got['B'] / got['ORT']:.3f}; B / A {got['B'] / got['A']:.3f}, "
        f"median per round {rounds:.3f}; load at the end {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
