"""Paired A/B of single cpu kernels: the same kernel of plan A (constants as they are), plan B (constants patched)
and plan C (A rebuilt, the control), each launched alone in turn (order reversed every round), and per kernel the
median over rounds of B/A and C/A taken within each round, with quartiles. On a noisy host a round's three launches
share its load, so the paired ratios are steadier than medians or minimums of separate runs.

A kernel launched alone finds its input unchanged in both cores' caches and its weights in L3; inside a replay the
step before has just written its input (half on each core) and its weights come from memory. Changes to how threads
split or share work can look several percent faster here and be slower in replays (docs/benchmarks.md, nineteenth
session): judge those with bench_team_steps.py --ab, in both orders.

OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_kernel_pairs.py \
    resnet50 --batch 16 --b conv_s2_c.S2_BATCH_BAND_ROWS=8 --prefix S2CONV --rounds 40
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_far_ab import build, parse
from bench_onnx import MODELS

from plait.bench.env import cpu_ticks, steal_text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--b", required=True, help="plan B's constants: NAME=literal (gemm_c's) or MODULE.NAME=literal")
    ap.add_argument("--prefix", default="", help="the kernels whose names start with this (default: every kernel)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--thread-time", action="store_true", help="the calling thread's CPU time, not wall time")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans = {}
    for label, patches in (("A", {}), ("B", parse(args.b)), ("C", {})):
        plan, _, y = build(args.model, x, patches)
        plans[label] = (plan, y)
    a, b = plans["A"][0], plans["B"][0]
    diff = float(np.abs(plans["A"][1] - plans["B"][1]).max())
    picked = [i for i, k in enumerate(a.kernels) if k.name.startswith(args.prefix)]
    if [k.name.split("_")[0] for k in a.kernels] != [k.name.split("_")[0] for k in b.kernels]:
        raise SystemExit("plans A and B run different kinds of kernels: compare whole replays instead")
    clock = time.thread_time if args.thread_time else time.perf_counter
    print(f"{args.model} b{args.batch}: A = as they are, B = {args.b}, C = A again; outputs differ by {diff:.2e}")
    before = cpu_ticks()
    for i in picked:
        times: dict[str, list[float]] = {k: [] for k in "ABC"}
        for r in range(args.rounds):
            for label in "ABC" if r % 2 == 0 else "CBA":
                launch = plans[label][0].launches[i]
                launch()  # warm: the kernel's operands in cache as a replay leaves them
                t0 = clock()
                launch()
                times[label].append(clock() - t0)
        ta, tb, tc = (np.array(times[k]) for k in "ABC")
        q = [np.quantile(t, (0.25, 0.5, 0.75)) for t in (tb / ta, tc / ta)]
        print(
            f"  {a.kernels[i].name.rsplit('_', 1)[0]:36s} A median {np.median(ta) * 1e3:8.3f} ms"
            f"  B/A {q[0][1]:.3f} [{q[0][0]:.3f}, {q[0][2]:.3f}]  C/A {q[1][1]:.3f} [{q[1][0]:.3f}, {q[1][2]:.3f}]",
            flush=True,
        )
    print(f"host steal {steal_text(before, cpu_ticks())} over the rounds")


if __name__ == "__main__":
    main()
