"""A/B of the cpu's stride-2 3x3 lanes kernel (plait/codegen/conv_s2_c.py) against the implicit GEMM it replaces,
side by side in one process on a benchmark CNN's twin, with ONNX Runtime's run of the exported model beside them.

Plan A is built with conv_s2_c.fits patched to refuse every product (the GEMM: `CONV` kernels), plan B as the tree
builds it; the outputs are checked. Then the stride-2 kernels of both plans are launched in turn (the i-th kernel
of each, order alternating; one thread: fewest thread CPU ms, more: median wall ms), and last whole replays of A, B
and ORT alternate (A and B swapped every round). The load average and the hypervisor's steal share over the
timing are printed.

    OMP_WAIT_POLICY=PASSIVE PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_conv_s2_ab.py resnet50 --batch 16
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

from plait.bench.env import cpu_ticks, steal_text
from plait.codegen import conv_s2_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin


def build(model: str, x: np.ndarray, lanes: bool) -> tuple[Any, np.ndarray]:
    """(plan, output) of the twin, its stride-2 3x3 layers on the lanes kernel when `lanes`, else on the GEMM."""
    saved = conv_s2_c.fits
    if not lanes:
        conv_s2_c.fits = lambda spec: False
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y
    finally:
        conv_s2_c.fits = saved


def layer_times(pa: Any, pb: Any, repeats: int, threads: int) -> list[tuple[str, float, float]]:
    """(B's kernel name, A ms, B ms) of each stride-2 kernel of B and the kernel at the same place in A."""
    picks = [i for i, k in enumerate(pb.kernels) if k.name.startswith("S2CONV_")]
    got: dict[str, list[list[float]]] = {"A": [[] for _ in picks], "B": [[] for _ in picks]}
    clock = time.thread_time if threads == 1 else time.perf_counter
    for r in range(repeats):
        for j, i in enumerate(picks):
            for label, plan in (("A", pa), ("B", pb)) if (r + j) % 2 == 0 else (("B", pb), ("A", pa)):
                t0 = clock()
                plan.launches[i]()
                got[label][j].append(clock() - t0)
    pick = min if threads == 1 else (lambda v: float(np.median(v)))
    return [(pb.kernels[i].name, pick(got["A"][j]) * 1e3, pick(got["B"][j]) * 1e3) for j, i in enumerate(picks)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=10, help="launches of each stride-2 kernel")
    ap.add_argument("--rounds", type=int, default=20, help="whole replays of each plan and of ORT")
    args = ap.parse_args()
    threads = int(os.environ["PLAIT_NUM_THREADS"])
    print(f"{args.model} b{args.batch}, {threads} thread(s), load {os.getloadavg()}")
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    (pa, ya), (pb, yb) = build(args.model, x, False), build(args.model, x, True)
    np.testing.assert_allclose(yb, ya, rtol=1e-4, atol=1e-4)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(export(args.model), opts, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], yb, rtol=1e-3, atol=1e-3)
    fns = {"A": pa.run, "B": pb.run, "ORT": lambda: sess.run(None, {"x": x})}
    for fn in fns.values():
        fn()
    ticks = cpu_ticks()
    stat = "fewest thread CPU" if threads == 1 else "median wall"
    for name, ta, tb in layer_times(pa, pb, args.repeats, threads):
        print(f"  {name.rsplit('_', 1)[0]} ({stat} ms): GEMM {ta:.2f} -> lanes {tb:.2f} ({tb / ta:.3f})")
    clock = time.thread_time if threads == 1 else time.perf_counter
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        for label in ("A", "B", "ORT") if r % 2 == 0 else ("B", "A", "ORT"):
            t0 = clock()
            fns[label]()
            times[label].append(clock() - t0)
        time.sleep(0.05)
    stolen = steal_text(ticks, cpu_ticks())
    pick = min if threads == 1 else (lambda v: float(np.median(v)))
    got = {k: pick(v) * 1e3 for k, v in times.items()}
    rounds = float(np.median(np.array(times["B"]) / np.array(times["A"])))
    print(f"whole replays ({stat} ms): " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()))
    print(
        f"plait / ORT: A {got['A'] / got['ORT']:.3f}, B {got['B'] / got['ORT']:.3f}; B / A {got['B'] / got['A']:.3f}, "
        f"median per round {rounds:.3f}; steal {stolen}; load at the end {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
