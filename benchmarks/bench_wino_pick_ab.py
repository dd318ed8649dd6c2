"""A/B of the cpu kernels' constants (winograd_c.pick's cost model by default; any plait.codegen module's as
MODULE.NAME) on a benchmark CNN's twin at two threads (--threads): the plan built with the constants as they are (B)
against the plan built with some of them changed (A, --old NAME=VALUE ...) or with winograd_c.py as it was at a git
revision (--a-rev REV), in one process.
Per kernel that differs between the plans, each is launched alone on the two-thread team (a warm-up launch, then a
timed one; the variants take turns), and whole team replays of both plans alternate; medians of each. Run it with
OMP_WAIT_POLICY=ACTIVE (a lone launch then does not pay for waking the sleeping thread) and --fifo on a shared
machine; the load average and the hypervisor's steal share over the run are printed with the numbers.

    OMP_WAIT_POLICY=ACTIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python \\
        benchmarks/bench_wino_pick_ab.py resnet18 --fifo \\
        --old 'SMALL_BLOCK_COST={24: 1.0, 12: 1.02, 8: 1.02, 6: 1.02}'
"""

from __future__ import annotations

import argparse
import ast
import ctypes
import importlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, twin
from bench_team_barrier import scheduling
from rev_module import module_at

import plait.graph.ops.winograd as winograd_ops
import plait.schedule.plan as plan_module
import plait.schedule.scheduler as scheduler
from plait.bench.env import cpu_ticks, steal_text
from plait.codegen import winograd_c


def _owner(name: str) -> tuple[Any, str]:
    """The module and attribute of constant `name`: winograd_c's NAME, or MODULE.NAME of another plait.codegen module
    (stem_pool_c.POOL_ROWS, conv_s2_c.TPT)."""
    if "." not in name:
        return winograd_c, name
    mod, attr = name.rsplit(".", 1)
    return importlib.import_module(f"plait.codegen.{mod}"), attr


# the modules that pick, render and transform with winograd_c: plan A's build points them at another revision's
USERS = (scheduler, plan_module, winograd_ops)


def build(model: str, x: np.ndarray, changes: dict[str, Any], module: Any = winograd_c) -> Any:
    """The twin's plan for `x` with the constants `changes` set and Winograd convolutions picked and rendered by
    `module` while it is built (then restored)."""
    saved = {k: getattr(*_owner(k)) for k in changes}
    for k, v in changes.items():
        setattr(*_owner(k), v)
    for user in USERS:
        user.winograd_c = module  # type: ignore[attr-defined]
    try:
        f = twin(model, "cpu")
        plan, _ = f.plan_for([x])
        f(x)
    finally:
        for user in USERS:
            user.winograd_c = winograd_c  # type: ignore[attr-defined]
        for k, v in saved.items():
            setattr(*_owner(k), v)
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--old",
        nargs="+",
        default=[],
        help="constants of plan A: NAME=literal (winograd_c's) or MODULE.NAME=literal (plait.codegen.MODULE's)",
    )
    ap.add_argument("--a-rev", default="", help="plan A's Winograd kernels by winograd_c.py at this git revision")
    ap.add_argument("--repeats", type=int, default=41, help="launches per differing kernel and variant")
    ap.add_argument("--replays", type=int, default=201, help="team replays per plan")
    ap.add_argument("--threads", type=int, default=2, help="the team's threads (PLAIT_NUM_THREADS the same)")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds of sleep before each timed replay")
    ap.add_argument("--fifo", action="store_true", help="SCHED_FIFO priority 1 for every thread while timing (root)")
    args = ap.parse_args()
    gomp = ctypes.CDLL("libgomp.so.1")
    gomp.omp_set_num_threads(args.threads)
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    changes = {k: ast.literal_eval(v) for k, v in (a.split("=", 1) for a in args.old)}
    old = module_at(args.a_rev, "plait/codegen/winograd_c.py", "winograd_c_old") if args.a_rev else winograd_c
    plans = [build(args.model, x, changes, old), build(args.model, x, {})]
    names = [[k.name for k in p.kernels] for p in plans]
    assert len(names[0]) == len(names[1]), "the variants' plans have different kernel counts"
    differ = [i for i, (a, b) in enumerate(zip(*names, strict=True)) if a != b]
    ticks, l0 = cpu_ticks(), os.getloadavg()[0]
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    times: list[dict[int, list[float]]] = [{i: [] for i in differ} for _ in plans]
    for r in range(args.repeats):
        for v in (0, 1) if r % 2 == 0 else (1, 0):
            for i in differ:
                launch = plans[v].launches[i]
                launch()
                t0 = time.perf_counter()
                launch()
                times[v][i].append(time.perf_counter() - t0)
    replays: list[list[float]] = [[], []]
    for r in range(args.replays):
        for v in (0, 1) if r % 2 == 0 else (1, 0):
            if args.pause:
                time.sleep(args.pause)
            t0 = time.perf_counter()
            plans[v].run()
            replays[v].append(time.perf_counter() - t0)
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    stolen = steal_text(ticks, cpu_ticks())
    print(
        f"{args.model} b{args.batch}, {args.threads} threads: A = {' '.join(args.old)} {args.a_rev}, B = as it is; load {l0:.2f} -> "
        f"{os.getloadavg()[0]:.2f}, steal {stolen} of the run"
    )
    total = [0.0, 0.0]
    for i in differ:
        a, b = (float(np.median(times[v][i])) * 1e3 for v in (0, 1))
        total[0] += a
        total[1] += b
        print(f"  {a:7.3f} -> {b:7.3f} ms  B/A {b / a:5.3f}  {names[0][i]} -> {names[1][i]}")
    if differ:
        print(f"  differing kernels: {total[0]:.3f} -> {total[1]:.3f} ms, B/A {total[1] / total[0]:.3f}")
    q = [np.percentile(np.array(t) * 1e3, [25, 50, 75]) for t in replays]
    print(
        f"  team replay median (p25-p75): A {q[0][1]:.2f} ({q[0][0]:.2f}-{q[0][2]:.2f}) ms, B {q[1][1]:.2f}"
        f" ({q[1][0]:.2f}-{q[1][2]:.2f}) ms, B/A {q[1][1] / q[0][1]:.3f}"
    )


if __name__ == "__main__":
    main()
