"""plait's cpu team with its worker threads pinned (PLAIT_PIN_THREADS=1, the default) and left to the scheduler (0),
at several thread counts: a benchmark CNN's twin timed back to back and after 0.2 s pauses, each (pin, threads) in a
fresh process (the team's placement is process-wide), the pairs alternated. Pinning was written for a 2-vCPU KVM
guest (docs/benchmarks.md, tenth session); this checks it on hosts with more CPUs.

    .venv/bin/python benchmarks/bench_pin_threads.py resnet50 --threads 2 4 8 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from bench_onnx import twin
model, batch = sys.argv[2], int(sys.argv[3])
run = twin(model, "cpu")
x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
for _ in range(3):
    run(x)
def timed(pause):
    out = []
    for _ in range(20 if not pause else 10):
        if pause:
            time.sleep(pause)
        t = time.perf_counter()
        run(x)
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)
print(json.dumps({"b2b": timed(0.0), "paused": timed(0.2), "load": os.getloadavg()[0]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    here = str(Path(__file__).resolve().parent)
    print(f"{a.model} b{a.batch}, {os.cpu_count()} CPUs; median ms of 20 calls back to back / 10 after 0.2 s pauses")
    print("| threads | pinned: back to back, after pause | unpinned: back to back, after pause | load |")
    print("| --- | --- | --- | --- |")
    for n in a.threads:
        got: dict[int, list[dict[str, float]]] = {0: [], 1: []}
        for _ in range(a.rounds):
            for pin in (1, 0):
                env = dict(os.environ, PLAIT_NUM_THREADS=str(n), OMP_NUM_THREADS=str(n), PLAIT_PIN_THREADS=str(pin))
                env["OMP_WAIT_POLICY"], env["PLAIT_DEVICE"] = "PASSIVE", "cpu"
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, here, a.model, str(a.batch)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                got[pin].append(json.loads(out.stdout.strip().splitlines()[-1]))

        def cell(rows: list[dict[str, float]]) -> str:
            return ", ".join("/".join(f"{r[k]:.2f}" for r in rows) for k in ("b2b", "paused"))

        load = max(r["load"] for rows in got.values() for r in rows)
        print(f"| {n} | {cell(got[1])} | {cell(got[0])} | {load:.1f} |", flush=True)


if __name__ == "__main__":
    main()
