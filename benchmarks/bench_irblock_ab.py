"""A/B of the fused inverted-residual blocks (plait/schedule/irblock.py) on a benchmark CNN's twin at inference, in one
process: plan A is built with the fusion off (irblock.MAX_PIXELS = 0: the expand, depthwise and projection kernels
apart) or with input planes up to --pixels-a fused, plan B with input planes up to --pixels fused; their replays take turns, three at a time after one untimed
replay, the order reversed every round, so load from other jobs falls on both alike. --onnx builds both from the model
exported to ONNX (plait.onnx, timed through InferenceSession.run) instead of plait's twin; --ort times ONNX Runtime
(CPU provider, PLAIT_NUM_THREADS intra-op threads) in the same rotation. --fifo runs every thread at SCHED_FIFO
priority 1 while timing (root only). Prints median ms [q1, q3] per plan, the fused block count and the largest
difference of the outputs (the twin's logits are nearly flat; tests/ops/test_irblock_c.py checks the blocks).

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_irblock_ab.py \
        mobilenet_v2 --fifo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from plait.onnx import InferenceSession
from plait.schedule import irblock

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, SETTLE_S, export, twin
from bench_team_barrier import scheduling


def build(model: str, x: np.ndarray, pixels: int, onnx: bytes | None = None) -> tuple[Any, np.ndarray, list[Any]]:
    """(a function running the twin's plan for `x` (or the ONNX model's session), its output, the plans) with blocks
    on input planes of up to `pixels` pixels fused."""
    saved = irblock.MAX_PIXELS
    irblock.MAX_PIXELS = pixels
    try:
        if onnx is not None:
            sess = InferenceSession(onnx, device="cpu")
            y = np.asarray(sess.run(None, {"x": x})[0])
            return partial(sess.run, None, {"x": x}), y, [c.plan for c in sess._plans.values() if c.plan is not None]
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        plan = f.plan_for([x])[0]
        return plan.run, y, [plan]
    finally:
        irblock.MAX_PIXELS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--pixels", type=int, default=irblock.MAX_PIXELS, help="plan B fuses input planes up to this")
    ap.add_argument("--pixels-a", type=int, default=0, help="plan A fuses input planes up to this (0: none)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--fifo", action="store_true")
    ap.add_argument("--onnx", action="store_true", help="plans from the exported ONNX model (plait.onnx)")
    ap.add_argument("--ort", action="store_true", help="time ONNX Runtime in the same rotation")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    model = export(args.model) if args.onnx or args.ort else None
    run_a, ya, plans_a = build(args.model, x, args.pixels_a, model if args.onnx else None)
    run_b, yb, plans_b = build(args.model, x, args.pixels, model if args.onnx else None)
    runs = {"A": run_a, "B": run_b}
    if args.ort:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(os.environ.get("PLAIT_NUM_THREADS", "2"))
        opts.inter_op_num_threads = 1
        ref = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        runs["ORT"] = partial(ref.run, None, {"x": x})
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    times: dict[str, list[float]] = {k: [] for k in runs}
    end, rounds = time.perf_counter() + args.seconds, 0
    while time.perf_counter() < end or rounds < 3:
        turn = list(runs.items())
        for label, run in turn if rounds % 2 == 0 else turn[::-1]:
            if args.ort:
                time.sleep(SETTLE_S)  # ORT's pool spins a while after a run: it must not fall on the next contender
            run()
            for _ in range(3):
                t0 = time.perf_counter()
                run()
                times[label].append((time.perf_counter() - t0) * 1e3)
        rounds += 1
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    out: dict[str, Any] = {
        "model": args.model + (" (ONNX)" if args.onnx else " (twin)"),
        "batch": args.batch,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "pixels A, B": [args.pixels_a, args.pixels],
        "fused blocks A, B": [
            sum(k.name.startswith("IRBLOCK") for p in ps for k in p.kernels) for ps in (plans_a, plans_b)
        ],
        "kernels A, B": [sum(len(p.kernels) for p in plans) for plans in (plans_a, plans_b)],
        "max abs diff": float(np.abs(ya - yb).max()),
        "max abs output": float(np.abs(ya).max()),
        "rounds": rounds,
        "load": round(os.getloadavg()[0], 2),
    }
    for label, t in times.items():
        out[f"{label} ms [q1, q3]"] = [round(float(np.percentile(t, q)), 3) for q in (50, 25, 75)]
    if args.ort:
        for label in ("A", "B"):
            out[f"{label} / ORT"] = round(float(np.median(times[label]) / np.median(times["ORT"])), 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
