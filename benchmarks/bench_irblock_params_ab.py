"""A/B of the fused inverted-residual blocks' parameters (plait/codegen/irblock_c.py module constants such as
L2_CHUNK, KC, ROWS_PIXELS) on mobilenet_v2's twin, in one process: plan A is rendered with the constants as they are,
plan B with each --set NAME=VALUE applied while it is built; --a-rev REV renders plan A with irblock_c.py as it
was at git revision REV instead (plan B with the file as it is), an A/B of a code change in one process. With PLAIT_NUM_THREADS=1 the plans' IRBLOCK kernels take
turns launch by launch and the fewest thread-CPU milliseconds count (robust to steal); at any thread count the whole
replays then take turns (three timed after one untimed, order reversed every round) for --seconds, wall time. The load
average and the hypervisor's steal share are printed with the numbers.

    PLAIT_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_irblock_params_ab.py --set L2_CHUNK=524288
    OMP_WAIT_POLICY=PASSIVE PLAIT_NUM_THREADS=2 OMP_NUM_THREADS=2 .venv/bin/python \\
        benchmarks/bench_irblock_params_ab.py --set L2_CHUNK=524288 --fifo
    PLAIT_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_irblock_params_ab.py --a-rev HEAD
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from plait.bench.env import cpu_ticks, steal_share
from plait.codegen import irblock_c
from plait.schedule import plan as plan_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import twin
from bench_onnx_kernels import interleaved_kernel_times
from bench_team_barrier import scheduling
from rev_module import module_at


def build(x: np.ndarray, model: str, sets: dict[str, int], module: Any = irblock_c) -> tuple[Any, np.ndarray]:
    """(the twin's plan for `x` with the blocks rendered by `module` and its constants `sets` in force, its
    output)."""
    saved = {k: getattr(module, k) for k in sets}
    for k, v in sets.items():
        setattr(module, k, v)
    plan_module.irblock_c = module  # type: ignore[attr-defined]
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y
    finally:
        plan_module.irblock_c = irblock_c  # type: ignore[attr-defined]
        for k, v in saved.items():
            setattr(module, k, v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="NAME=VALUE of an irblock_c constant for plan B")
    ap.add_argument("--a-rev", default="", help="plan A rendered by irblock_c.py at this git revision")
    ap.add_argument("--repeats", type=int, default=15, help="one thread: launches per kernel, the fewest count")
    ap.add_argument("--seconds", type=float, default=15.0, help="whole replays taking turns this long")
    ap.add_argument("--fifo", action="store_true", help="SCHED_FIFO priority 1 while timing replays (root)")
    args = ap.parse_args()
    sets = {k: int(v) for k, v in (s.split("=", 1) for s in args.set)}
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    old = module_at(args.a_rev, "plait/codegen/irblock_c.py", "irblock_c_old") if args.a_rev else irblock_c
    (pa, ya), (pb, yb) = build(x, args.model, {}, old), build(x, args.model, sets)
    plans = {"A": pa, "B": pb}
    ticks = cpu_ticks()
    out: dict[str, Any] = {
        "model": args.model,
        "batch": args.batch,
        "A rev": args.a_rev,
        "B sets": sets,
        "load": os.getloadavg()[0],
    }
    out["threads"] = os.environ.get("PLAIT_NUM_THREADS")
    out["max abs diff"] = float(np.abs(ya - yb).max())
    if os.environ.get("PLAIT_NUM_THREADS") == "1":
        times = interleaved_kernel_times(plans, args.repeats)
        blocks = [
            (name.rsplit("_", 1)[0], a * 1e3, b * 1e3)
            for (a, name), (b, _) in zip(times["A"], times["B"], strict=True)
            if name.startswith("IRBLOCK")
        ]
        out["1t cpu ms A, B (all kernels)"] = [round(sum(t for t, _ in times[k]) * 1e3, 3) for k in "AB"]
        out["1t cpu ms A, B (IRBLOCK)"] = [round(sum(r[1] for r in blocks), 3), round(sum(r[2] for r in blocks), 3)]
        for name, a, b in blocks:
            print(f"  {name:40s} A {a:.3f} B {b:.3f} ms  {b / a - 1:+.1%}")
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    reps: dict[str, list[float]] = {"A": [], "B": []}
    end, rounds = time.perf_counter() + args.seconds, 0
    while time.perf_counter() < end or rounds < 3:
        for label in "AB" if rounds % 2 == 0 else "BA":
            plans[label].run()
            for _ in range(3):
                t0 = time.perf_counter()
                plans[label].run()
                reps[label].append((time.perf_counter() - t0) * 1e3)
        rounds += 1
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    for label, t in reps.items():
        out[f"replay {label} ms [median, q1, q3]"] = [round(float(np.percentile(t, q)), 3) for q in (50, 25, 75)]
    share = steal_share(ticks, cpu_ticks())
    out["steal"] = None if share is None else round(share, 4)
    out["load at end"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
