"""Where a two-thread team replay loses after an idle pause: the stamped team runner of bench_team_steps.py, run on
a benchmark CNN's twin back to back and with a sleep before each replay (the pause bench_onnx.py's rounds leave
between calls), per step the slowest thread's kernel wall time, the threads' CPU time and the barrier waits, and
the steps whose span grew most after the pause. --ab OLD NEW builds a plan B from the kernel sources with OLD
replaced by NEW (a marker such as `/*irs*/4L` put in a template for the trial) and runs it in the same rounds, so
a change meant for the first calls after a pause is judged against the same minutes.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python \\
        benchmarks/bench_team_steps_pause.py resnet50 --pause 0.2 --replays 40 --top 15
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS
from bench_team_steps import add_ab, build_ab, per_step, stamped_replays, steal_ticks

from plait.runtime.cpu_team import TeamRun


def replays(device: object, run: TeamRun, count: int, pause: float) -> tuple[np.ndarray, list[float]]:
    """`count` stamped replays at the team's thread count (PLAIT_NUM_THREADS, default 2), each after `pause` seconds
    of sleep: stamps (count, steps, threads, 4) and wall ms."""
    return stamped_replays(device, run, int(os.environ.get("PLAIT_NUM_THREADS", "2")), count, pause)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--pause", type=float, default=0.2)
    ap.add_argument("--replays", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2, help="turns of the pauses (and plans); all are pooled")
    ap.add_argument("--top", type=int, default=15)
    add_ab(ap)
    a = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((a.batch, 3, 224, 224)).astype(np.float32)
    plans = build_ab(a.model, a.batch, x, a.ab)
    if "B" in plans and float(np.abs(plans["B"][2] - plans["A"][2]).max()) > 1e-3:
        raise SystemExit("plans A and B disagree: the replacement changed the results")
    load0, steal0 = os.getloadavg()[0], steal_ticks()
    res: dict[str, dict[float, tuple[np.ndarray, list[float]]]] = {k: {} for k in plans}
    for r in range(a.rounds):
        for label in list(plans) if r % 2 == 0 else list(plans)[::-1]:
            plan, run, _ = plans[label]
            for p in (0.0, a.pause):
                st, w = replays(plan.device, run, a.replays, p)  # type: ignore[attr-defined]
                old = res[label].get(p)
                res[label][p] = (np.concatenate([old[0], st]), old[1] + w) if old else (st, w)
    print(f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}, steal ticks {steal_ticks() - steal0}")
    steps = {label: {p: per_step(v[0]) for p, v in by.items()} for label, by in res.items()}
    for label, by in res.items():
        for p, (st, w) in by.items():
            s = steps[label][p]
            late = np.median((st[:, 0, :, 1] - st[:, 0, :, 1].min(axis=1, keepdims=True)).max(axis=1)) / 1e6
            print(
                f"{label} pause {p:.2f} s: replay median {np.median(w):.2f} (p25-p75 {np.percentile(w, 25):.2f}-"
                f"{np.percentile(w, 75):.2f}) ms, spans {s['span'].sum():.2f}, slowest-thread work "
                f"{s['max'].sum():.2f}, cpu both {s['cpu'].sum():.2f}, barrier waits {s['wait'].sum():.2f}, 2nd "
                f"thread starts step 0 {late:.3f} ms late"
            )
    b, q = steps["A"][0.0], steps["A"][a.pause]
    other = steps["B"][a.pause] if "B" in steps else None
    grow = q["span"] - b["span"]
    print("  step  span0  spanP  grow   work0  workP  cpu0   cpuP   wait0  waitP  [B spanP]  kernel")
    for i in np.argsort(-grow)[: a.top]:
        extra = f"{other['span'][i]:7.3f}  " if other is not None else ""
        print(
            f"  {i:4d} {b['span'][i]:6.3f} {q['span'][i]:6.3f} {grow[i]:6.3f} {b['max'][i]:6.3f} {q['max'][i]:6.3f} "
            f"{b['cpu'][i]:6.3f} {q['cpu'][i]:6.3f} {b['wait'][i]:6.3f} {q['wait'][i]:6.3f}  {extra}"
            f"{plans['A'][0].kernels[i].name}"  # type: ignore[attr-defined]
        )


if __name__ == "__main__":
    main()
