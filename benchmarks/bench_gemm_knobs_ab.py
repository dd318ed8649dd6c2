"""A/B of the cpu GEMM's blocking constants (plait/codegen/gemm_c.py: KC_MAX, CPAN_MAX, KC_NARROW, NARROW_COLS,
TILE_COST, ...) on a benchmark CNN's twin, every variant a whole plan built in one process.

Each `--variant` is a list of NAME=VALUE patches to gemm_c's module constants (integers, or TILE_COST as
MRxNV:cost pairs), applied while its plan is rendered; plan "base" is the code as it is. The outputs are checked
against the base plan's, then the plans' kernels take turns kernel by kernel (`kernel_times`) and the GEMM
library's kernels (GEMM, CONV, S2CONV, ...) are summed per kind. One thread: fewest thread CPU ms, which other jobs
on a shared machine barely move; more threads (PLAIT_NUM_THREADS): median wall ms, best with --fifo
(OMP_WAIT_POLICY=ACTIVE, so a lone launch does not wake a sleeping thread). Finds which blocking suits the machine it runs on (cache sizes differ by host):

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_gemm_knobs_ab.py resnet50 \
        --variant KC_MAX=128 --variant KC_MAX=384 --variant CPAN_MAX=4
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PLAIT_NUM_THREADS", "1")

import numpy as np
import onnxruntime as ort

from plait.bench.env import cpu_ticks
from plait.codegen import conv_s2_c, gemm_c, pointwise_c, stem_pool_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin
from bench_team_barrier import scheduling

MODULES = {"gemm_c": gemm_c, "pointwise_c": pointwise_c, "stem_pool_c": stem_pool_c, "conv_s2_c": conv_s2_c}


def parse(variant: str) -> dict[str, Any]:
    """'KC_MAX=128,TILE_COST=8x3:1.02/6x4:1.0,pointwise_c.LANES_MAX_K=511' -> the patches it names (gemm_c's
    constants unless a module is named)."""
    out: dict[str, Any] = {}
    for item in filter(None, variant.split(",")):
        name, _, value = item.partition("=")
        mod, _, attr = name.rpartition(".")
        if not hasattr(MODULES[mod or "gemm_c"], attr):
            raise SystemExit(f"no {name}")
        if name == "TILE_COST":
            cost = dict(gemm_c.TILE_COST)
            for pair in value.split("/"):
                t, _, c = pair.partition(":")
                mr, nv = (int(v) for v in t.split("x"))
                cost[(mr, nv)] = float(c)
            out[name] = cost
        else:
            out[name] = int(value)
    return out


def build(model: str, x: np.ndarray, patches: dict[str, Any]) -> tuple[Any, np.ndarray]:
    """(plan, output) of the twin rendered with the codegen constants patched."""

    def target(name: str) -> tuple[Any, str]:
        mod, _, attr = name.rpartition(".")
        return MODULES[mod or "gemm_c"], attr

    saved = {name: getattr(*target(name)) for name in patches}
    saved["COMMON"] = gemm_c.COMMON
    for name, value in patches.items():
        setattr(*target(name), value)
    gemm_c.COMMON = gemm_c.common()  # the packing library's constants are substituted at import
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y
    finally:
        for name, value in saved.items():
            setattr(*target(name), value)


def kernel_times(plans: dict[str, Any], repeats: int, only: tuple[str, ...]) -> dict[str, list[tuple[float, str]]]:
    """Per plan: (fewest thread CPU seconds of `repeats` launches, kernel name) per kernel; with more than one thread,
    median wall seconds. The plans take turns
    kernel by kernel, and each timed launch follows an untimed launch of the same plan's previous kernel, as in a
    replay: taking turns alone left the plans that happened to run twice in a row (the first and last of the list,
    the order alternating) with their inputs in cache, 15% faster on some kernels whatever their constants. With
    `only`, just the kernels of those kinds are timed."""
    wall = int(os.environ["PLAIT_NUM_THREADS"]) > 1
    clock = time.perf_counter if wall else time.thread_time
    got: dict[str, list[list[float]]] = {label: [[] for _ in p.launches] for label, p in plans.items()}
    labels = list(plans)
    kernels = plans[labels[0]].kernels
    timed = [i for i, k in enumerate(kernels) if not only or k.name.split("_")[0] in only]
    for r in range(repeats):
        for i in timed:
            for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                launches = plans[label].launches
                if i:
                    launches[i - 1]()
                t0 = clock()
                launches[i]()
                got[label][i].append(clock() - t0)
    pick = (lambda v: float(np.median(v)) if v else float("inf")) if wall else (lambda v: min(v, default=float("inf")))
    return {
        label: [(pick(t), k.name) for t, k in zip(got[label], p.kernels, strict=True)] for label, p in plans.items()
    }


def replays(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds of whole runs (wall with more than one thread, else thread CPU), the functions in turn, the order
    rotating every round; a pause after ONNX Runtime's."""
    clock = time.perf_counter if int(os.environ["PLAIT_NUM_THREADS"]) > 1 else time.thread_time
    labels = list(fns)
    out: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(rounds):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            t0 = clock()
            fns[label]()
            out[label].append(clock() - t0)
            if label == "ORT":  # its pool's threads spin on after a run: the next plan would meet them
                time.sleep(0.05)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[], help="NAME=VALUE[,NAME=VALUE...] patches of gemm_c")
    ap.add_argument("--repeats", type=int, default=10, help="launches of each kernel; the fewest thread CPU ms count")
    ap.add_argument("--only", default="", help="time only kernels of these kinds, e.g. GEMM,CONV")
    ap.add_argument("--fifo", action="store_true", help="SCHED_FIFO priority 1 for every thread while timing (root)")
    ap.add_argument("--replays", type=int, default=0, help="then this many whole replays of each plan, in turn")
    ap.add_argument("--ort", action="store_true", help="ONNX Runtime's run of the exported net takes turns too")
    ap.add_argument("--show", type=float, default=3.0, help="list kernels whose best variant differs by this %%")
    args = ap.parse_args()
    ticks0 = cpu_ticks()
    print(f"{args.model} b{args.batch}, load {os.getloadavg()}")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans: dict[str, Any] = {}
    base, y0 = build(args.model, x, {})
    plans["base"] = base
    for v in args.variant:
        plan, y = build(args.model, x, parse(v))
        np.testing.assert_allclose(y, y0, rtol=1e-4, atol=1e-4)
        plans[v] = plan
    fns: dict[str, Callable[[], Any]] = {label: plan.run for label, plan in plans.items()}
    if args.ort:
        threads = int(os.environ["PLAIT_NUM_THREADS"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(export(args.model), opts, providers=["CPUExecutionProvider"])
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], y0, rtol=1e-3, atol=1e-3)
        fns["ORT"] = lambda: sess.run(None, {"x": x})
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    try:
        per = kernel_times(plans, args.repeats, tuple(filter(None, args.only.split(","))))
        runs = replays(fns, args.replays)
    finally:
        if args.fifo:
            scheduling(os.SCHED_OTHER, 0)
    stat = "median wall" if int(os.environ["PLAIT_NUM_THREADS"]) > 1 else "fewest thread CPU"
    kinds: dict[str, collections.Counter[str]] = {label: collections.Counter() for label in plans}
    for label, rows in per.items():
        for t, name in rows:
            kinds[label][name.split("_")[0]] += t * 1e3
    for kind in [k for k in kinds["base"] if kinds["base"][k] < float("inf")]:
        cells = ", ".join(f"{label} {kinds[label][kind]:.2f}" for label in plans)
        print(f"  {kind} ({stat} ms): {cells}")
    totals = ", ".join(f"{label} {sum(t for t in kinds[label].values() if t < float('inf')):.2f}" for label in plans)
    print(f"  all timed kernels: {totals}")
    for i, (t0, name) in enumerate(per["base"]):
        ts = {label: per[label][i][0] for label in plans}
        if max(abs(t / t0 - 1) for t in ts.values()) * 100 >= args.show:
            print(f"  {name}: " + ", ".join(f"{label} {t * 1e3:.3f}" for label, t in ts.items()))
    if args.replays:
        pick = np.median if int(os.environ["PLAIT_NUM_THREADS"]) > 1 else np.min
        base = np.array(runs["base"])
        cells = ", ".join(
            f"{label} {float(pick(v)) * 1e3:.2f} ({float(np.median(np.array(v) / base)):.3f})"
            for label, v in runs.items()
        )
        print(
            f"  whole replays ({'median wall' if pick is np.median else 'fewest thread CPU'} ms, median ratio to base "
            f"per round): {cells}"
        )
    ticks1 = cpu_ticks()
    stolen = ticks1[0] - ticks0[0] if ticks0 and ticks1 else "n/a"
    print(f"steal ticks {stolen}, load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
