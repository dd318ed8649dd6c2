"""A/B of the cpu training step with the channels-last stride-1 weight gradient ("new", wgrad_c.CL_ENABLED as
committed) against the position-major stride-1 form ("old", CL_ENABLED = 0), all in one process. Whole steps:
new, old and PyTorch eager timed in turns (round robin), medians of wall and process CPU time, load and the
hypervisor's steal share. `--kernels`: every kernel of both steps run alone, one at a time in turns, each kernel's
minimum process CPU time over the rounds, summed per step and per kind (train_kernels_ab.py's way).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/train_wgrad_cl_ab.py --models resnet18 --rounds 7 --threads 2
    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 python benchmarks/train_wgrad_cl_ab.py --kernels --threads 1
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
from collections.abc import Callable, Iterator
from typing import Any


def _module(name: str) -> Any:
    """benchmarks/<name>.py as a module (the folder is no package)."""
    path = pathlib.Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def old_form() -> Iterator[None]:
    """The position-major stride-1 weight gradient while a step is built, traced and realized. The realized
    recipes are dropped on entry and exit: the two steps' graphs are equal, so the second would replay the first's
    kernels."""
    from plait.codegen import wgrad_c
    from plait.schedule import plan

    saved = wgrad_c.CL_ENABLED
    wgrad_c.CL_ENABLED = 0
    plan._RECIPES.clear()
    try:
        yield
    finally:
        wgrad_c.CL_ENABLED = saved
        plan._RECIPES.clear()


def kernels_ab(name: str, batch: int, rounds: int) -> None:
    """Per-kernel minima of both steps' kernels, run alone in turns."""
    from plait.bench.env import cpu_ticks, steal_text

    kab = _module("train_kernels_ab")
    steps = {"new": kab.kernels(name, batch, [])}
    with old_form():
        steps["old"] = kab.kernels(name, batch, [])
    best = {k: [float("inf")] * len(v) for k, v in steps.items()}
    load, ticks = [os.getloadavg()[0]], cpu_ticks()
    for _ in range(rounds):
        for k, ks in steps.items():
            for i, (_, fn) in enumerate(ks):
                t = time.process_time()
                fn()
                best[k][i] = min(best[k][i], time.process_time() - t)
    load.append(os.getloadavg()[0])
    print(
        f"== {name} b{batch} kernels, {rounds} rounds, load {load[0]:.1f}-{load[1]:.1f}, steal {steal_text(ticks, cpu_ticks())}"
    )
    kinds: dict[str, dict[str, float]] = {}
    for k, ks in steps.items():
        by: dict[str, float] = defaultdict(float)
        for (kname, _), t in zip(ks, best[k], strict=True):
            m = re.match(r"[A-Z0-9]+", kname)
            by[m.group(0) if m else kname] += t * 1e3
        kinds[k] = by
        print(f"{k}: {len(ks)} kernels, {sum(best[k]) * 1e3:.1f} ms CPU (sum of per-kernel minima)")
    moved = sorted(set(kinds["new"]) | set(kinds["old"]), key=lambda n: -abs(kinds["new"][n] - kinds["old"][n]))
    print("by kind, old -> new ms: " + "; ".join(f"{n} {kinds['old'][n]:.1f} -> {kinds['new'][n]:.1f}" for n in moved))


def steps_ab(name: str, batch: int, rounds: int) -> None:
    """Whole steps of new, old and PyTorch eager in turns."""
    from plait.bench.env import cpu_ticks, steal_text

    ab = _module("train_step_ab")
    steps: dict[str, Callable[[], Any]] = {}
    firsts: dict[str, float] = {}
    steps["new"], firsts["new"] = ab.plait_step(name, batch, "cpu", [])
    with old_form():
        steps["old"], firsts["old"] = ab.plait_step(name, batch, "cpu", [])
    steps["torch"], firsts["torch"] = ab.torch_step(name, batch)
    times: dict[str, list[float]] = {k: [] for k in steps}
    cpu: dict[str, list[float]] = {k: [] for k in steps}
    load, ticks = [os.getloadavg()[0]], cpu_ticks()
    for _ in range(rounds):
        for k, f in steps.items():
            t, c = time.perf_counter(), time.process_time()
            f()
            times[k].append((time.perf_counter() - t) * 1e3)
            cpu[k].append((time.process_time() - c) * 1e3)
    load.append(os.getloadavg()[0])
    print(
        f"== {name} b{batch}, {rounds} rounds, load {load[0]:.1f}-{load[1]:.1f}, steal {steal_text(ticks, cpu_ticks())}"
    )
    print("first loss: " + ", ".join(f"{k} {v:.5f}" for k, v in firsts.items()))
    med = {k: statistics.median(v) for k, v in times.items()}
    for k in steps:
        print(
            f"{k:6s} {med[k]:10.2f} ms  torch/{k} {med['torch'] / med[k]:.2f}x"
            f"  cpu time median {statistics.median(cpu[k]):.2f} ms, min {min(cpu[k]):.2f} ms"
        )


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernels", action="store_true", help="per-kernel minima instead of whole steps")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.models.split(","):
        (kernels_ab if args.kernels else steps_ab)(name, args.batch, args.rounds)


if __name__ == "__main__":
    main()
