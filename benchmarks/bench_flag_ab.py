"""Plan A against plan B of one benchmark CNN's twin, judged round by round: the two plans take turns (the order
flips every round), each round times a few replays of each, and what is reported is the median over rounds of the
per-round ratio B / A with its quartiles. On the noisy 2-vCPU guest (docs/benchmarks.md: the host moves the vCPUs
apart, together, and at times onto one core) a ratio taken within one round is steadier than the ratio of two pooled
medians, and the quartiles say whether a difference is more than the noise. Run both orders (A and B swapped): the
plan built second tends to gain a little.

Plan B differs from plan A by a module constant read when kernels are rendered or plans are built (--flag MODULE
NAME A B: plan A is built with MODULE.NAME = A, plan B with B, both Python expressions), or by kernel source text
(--ab OLD NEW, repeatable, as bench_team_steps.py). Whole replays (plan.run, the real team runner) by default,
optionally each after a pause as bench_onnx.py's rounds leave (--pause); with --steps, each kernel's time inside the
replays (bench_team_steps.py's stamped runner: one thread's CPU time per step at one thread, the step's span at more).

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_flag_ab.py \\
        mobilenet_v2 --flag plait.codegen.irblock_c VECTOR_MAJOR False True --pause 0.2
    ... bench_flag_ab.py mobilenet_v2 --steps --threads 1 --flag plait.codegen.irblock_c VECTOR_MAJOR True False
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS
from bench_team_steps import add_ab, build, build_ab, per_step, stamped_replays


def plans(model: str, batch: int, x: np.ndarray, flag: list[str] | None, ab: list[tuple[str, str]]) -> dict[str, Any]:
    """Plans A and B as bench_team_steps.build gives them (plan, team run, output)."""
    if flag:
        mod, name, va, vb = flag
        target = importlib.import_module(mod)
        if not hasattr(target, name):
            raise SystemExit(f"{mod} has no {name}")
        saved = getattr(target, name)
        try:
            setattr(target, name, eval(va))
            a = build(model, batch, x)
            setattr(target, name, eval(vb))
            return {"A": a, "B": build(model, batch, x)}
        finally:
            setattr(target, name, saved)
    if not ab:
        raise SystemExit("give --flag MODULE NAME A B or --ab OLD NEW")
    return build_ab(model, batch, x, ab)


def quartiles(v: list[float] | np.ndarray) -> str:
    q = np.percentile(v, [25, 50, 75])
    return f"{q[1]:.3f} [{q[0]:.3f}, {q[2]:.3f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reps", type=int, default=4, help="replays of each plan per round")
    ap.add_argument("--pause", type=float, default=0.0, help="seconds of sleep before each timed replay")
    ap.add_argument("--steps", action="store_true", help="per kernel, through the stamped runner")
    ap.add_argument("--threads", type=int, default=2, help="--steps: the team's threads")
    ap.add_argument("--top", type=int, default=10, help="--steps: list this many steps, costliest first")
    ap.add_argument("--flag", nargs=4, metavar=("MODULE", "NAME", "A", "B"))
    add_ab(ap)
    a = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((a.batch, 3, 224, 224)).astype(np.float32)
    p = plans(a.model, a.batch, x, a.flag, [(old, new) for old, new in a.ab])
    print(f"{a.model} b{a.batch}: max abs diff of B from A {float(np.abs(p['A'][2] - p['B'][2]).max()):.3g}")
    key = "span" if a.threads > 1 else "cpu"
    whole: list[float] = []
    steps: list[np.ndarray] = []
    a_steps: list[np.ndarray] = []
    ms: dict[str, list[float]] = {"A": [], "B": []}
    for r in range(a.rounds):
        got: dict[str, Any] = {}
        for label in ("A", "B") if r % 2 == 0 else ("B", "A"):
            plan, run, _ = p[label]
            if a.steps:
                st, _ = stamped_replays(plan.device, run, a.threads, a.reps, a.pause)
                got[label] = per_step(st)[key]
                continue
            plan.run()
            t = []
            for _ in range(a.reps):
                if a.pause:
                    time.sleep(a.pause)
                t0 = time.perf_counter()
                plan.run()
                t.append((time.perf_counter() - t0) * 1e3)
            got[label] = float(np.median(t))
            ms[label] += t
        if a.steps:
            steps.append(got["B"] / got["A"])
            a_steps.append(got["A"])
            whole.append(float(got["B"].sum() / got["A"].sum()))
        else:
            whole.append(got["B"] / got["A"])
    what = f"sum of step {key}s" if a.steps else "replay wall time"
    print(f"B / A, {what}, per round: {quartiles(whole)} over {a.rounds} rounds")
    if not a.steps:
        print(f"medians: A {np.median(ms['A']):.2f} ms, B {np.median(ms['B']):.2f} ms")
        return
    ratios, cost = np.array(steps), np.median(np.array(a_steps), axis=0)
    names = [k.name for k in p["A"][0].kernels]
    for i in np.argsort(-cost)[: a.top]:
        print(f"  {i:4d} A {cost[i]:7.3f} ms  B / A {quartiles(ratios[:, i])}  {names[i]}")


if __name__ == "__main__":
    main()
