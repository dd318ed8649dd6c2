"""A/B of the cpu training step with Winograd's per-call weight transform from 784 output positions ("new",
winograd_c.PER_CALL_MIN_POSITIONS as committed) against 2048 ("old": layer4's input gradients on the implicit GEMM,
its forwards folded), plus PyTorch eager, all in one process, timed in turns (round robin) as in train_step_ab.py.
Prints medians of wall and process CPU time, the load average and the hypervisor's steal share over the rounds.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/train_percall_ab.py --models resnet18 --rounds 7 --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pathlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any


def _ab() -> Any:
    """benchmarks/train_step_ab.py as a module (the folder is no package)."""
    path = pathlib.Path(__file__).with_name("train_step_ab.py")
    spec = importlib.util.spec_from_file_location("train_step_ab", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def old_threshold() -> Iterator[None]:
    """The per-call threshold before this change while a step is built and traced."""
    from plait.codegen import winograd_c

    saved = winograd_c.PER_CALL_MIN_POSITIONS
    winograd_c.PER_CALL_MIN_POSITIONS = 2048
    try:
        yield
    finally:
        winograd_c.PER_CALL_MIN_POSITIONS = saved


def main() -> None:
    import torch

    from plait.bench.env import cpu_ticks, steal_text

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ab = _ab()
    for name in args.models.split(","):
        steps: dict[str, Callable[[], Any]] = {}
        firsts: dict[str, float] = {}
        steps["new"], firsts["new"] = ab.plait_step(name, args.batch, "cpu", [])
        with old_threshold():
            steps["old"], firsts["old"] = ab.plait_step(name, args.batch, "cpu", [])
        steps["torch"], firsts["torch"] = ab.torch_step(name, args.batch)
        times: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        load, ticks = [os.getloadavg()[0]], cpu_ticks()
        for _ in range(args.rounds):
            for k, f in steps.items():
                t, c = time.perf_counter(), time.process_time()
                f()
                times[k].append((time.perf_counter() - t) * 1e3)
                cpu[k].append((time.process_time() - c) * 1e3)
        load.append(os.getloadavg()[0])
        stolen = steal_text(ticks, cpu_ticks())
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"== {name} b{args.batch}, {args.threads} threads, {args.rounds} rounds,"
            f" load {load[0]:.1f}-{load[1]:.1f}, steal {stolen}"
        )
        print("first loss: " + ", ".join(f"{k} {v:.5f}" for k, v in firsts.items()))
        for k in steps:
            print(
                f"{k:6s} {med[k]:10.2f} ms  torch/{k} {med['torch'] / med[k]:.2f}x"
                f"  cpu time median {statistics.median(cpu[k]):.2f} ms, min {min(cpu[k]):.2f} ms"
            )


if __name__ == "__main__":
    main()
