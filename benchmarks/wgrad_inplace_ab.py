"""A/B of the cpu weight-gradient kernel reading dy in place (plait/codegen/wgrad_c.py) against the same kernel with
dy's rows copied per chunk of patch rows as before (its `inplace` switched off in the rendered source), in one
process: either every kernel of a training step alone, one-thread process CPU time, minimum over the rounds
(`kernels`), or whole steps in turns with PyTorch eager (`step`, medians of wall time and CPU time).

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 python benchmarks/wgrad_inplace_ab.py kernels --models resnet18 --rounds 3
    OMP_WAIT_POLICY=PASSIVE python benchmarks/wgrad_inplace_ab.py step --models resnet18 --rounds 9 --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pathlib
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

SWITCH = "int inplace = npos % 16 == 0 && co % 4 == 0;"


def _script(name: str) -> Any:
    """A sibling benchmark script as a module (the folder is no package)."""
    path = pathlib.Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def copied_dy() -> Iterator[None]:
    """Build with dy's rows copied; replay recipes are dropped on both sides so the step is scheduled afresh."""
    from plait.codegen import wgrad_c
    from plait.schedule import plan

    saved = wgrad_c._source

    def source() -> str:
        text = saved()
        if SWITCH not in text:
            raise SystemExit(f"wgrad_c's source no longer has {SWITCH!r}: this A/B is out of date")
        return text.replace(SWITCH, "int inplace = 0;")

    plan._RECIPES.clear()
    wgrad_c._source = source
    try:
        yield
    finally:
        wgrad_c._source = saved
        plan._RECIPES.clear()


def kernels(name: str, batch: int, rounds: int) -> None:
    tk = _script("train_kernels_ab")
    steps = {"new": tk.kernels(name, batch, [])}
    with copied_dy():
        steps["old"] = tk.kernels(name, batch, [])
    best = {k: [float("inf")] * len(v) for k, v in steps.items()}
    load = os.getloadavg()[0]
    for _ in range(rounds):
        for k, ks in steps.items():
            for i, (_, fn) in enumerate(ks):
                t = time.process_time()
                fn()
                best[k][i] = min(best[k][i], time.process_time() - t)
    print(f"== {name} b{batch} kernels, {rounds} rounds, load {load:.1f}-{os.getloadavg()[0]:.1f}")
    for k, ks in steps.items():
        by: dict[str, float] = defaultdict(float)
        for (kname, _), t in zip(ks, best[k], strict=True):
            m = re.match(r"[A-Z0-9]+", kname)
            by[m.group(0) if m else kname] += t * 1e3
        top = ", ".join(f"{n} {v:.1f}" for n, v in sorted(by.items(), key=lambda e: -e[1])[:5])
        print(f"{k}: {sum(best[k]) * 1e3:.1f} ms CPU (sum of per-kernel minima); {top}")


def step(name: str, batch: int, rounds: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    ab = _script("train_step_ab")
    steps, firsts = {}, {}
    steps["new"], firsts["new"] = ab.plait_step(name, batch, "cpu", [])
    with copied_dy():
        steps["old"], firsts["old"] = ab.plait_step(name, batch, "cpu", [])
    steps["torch"], firsts["torch"] = ab.torch_step(name, batch)
    wall: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    load = os.getloadavg()[0]
    for _ in range(rounds):
        for k, f in steps.items():
            t, c = time.perf_counter(), time.process_time()
            f()
            wall[k].append((time.perf_counter() - t) * 1e3)
            cpu[k].append((time.process_time() - c) * 1e3)
    med = {k: statistics.median(v) for k, v in wall.items()}
    print(f"== {name} b{batch} step, {threads} threads, {rounds} rounds, load {load:.1f}-{os.getloadavg()[0]:.1f}")
    print("first loss: " + ", ".join(f"{k} {v:.5f}" for k, v in firsts.items()))
    for k in steps:
        print(
            f"{k:6s} {med[k]:9.2f} ms  torch/{k} {med['torch'] / med[k]:.3f}x"
            f"  cpu median {statistics.median(cpu[k]):.1f} ms, min {min(cpu[k]):.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("kernels", "step"))
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    for name in args.models.split(","):
        if args.mode == "kernels":
            kernels(name, args.batch, args.rounds)
        else:
            step(name, args.batch, args.rounds, args.threads)


if __name__ == "__main__":
    main()
