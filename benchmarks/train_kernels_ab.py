"""One-thread kernel CPU time of a compiled training step, new against old (parts of the backward switched back as
in train_step_ab.py), robust to a loaded machine: both steps are built in one process, then in each round every
kernel of each step runs alone, timed by process CPU time, variants in turns; a kernel's time is its minimum over
the rounds and a step's is the sum. Also prints the kinds whose sums moved most.

    OMP_NUM_THREADS=1 PLAIT_NUM_THREADS=1 python benchmarks/train_kernels_ab.py --models resnet18 --old fwd,pool
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import re
import time
from collections import defaultdict
from typing import Any


def _ab() -> Any:
    """benchmarks/train_step_ab.py as a module (the folder is no package)."""
    path = pathlib.Path(__file__).with_name("train_step_ab.py")
    spec = importlib.util.spec_from_file_location("train_step_ab", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernels(name: str, batch: int, old: list[str]) -> list[tuple[str, Any]]:
    """(kernel name, the kernel bound on its own) for every launch of a replaying compiled step."""
    run, _ = _ab().plait_step(name, batch, "cpu", old)
    run()
    step = next(c.cell_contents for c in run.__closure__ if hasattr(c.cell_contents, "traces"))
    replay = next(t.replay for t in step.traces.values() if t.replay is not None)
    return [
        (la.kernel.name, la.program.bind(la.buffers, la.kernel.global_size, la.kernel.local_size))
        for la in replay.keep.launches
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cifar_cnn")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", default="fwd,pool,dw,plain", help="parts switched off in the 'old' variant")
    args = ap.parse_args()
    old = [p for p in args.old.split(",") if p]
    for name in args.models.split(","):
        steps = {"new": kernels(name, args.batch, []), "old": kernels(name, args.batch, old)}
        best: dict[str, list[float]] = {k: [float("inf")] * len(v) for k, v in steps.items()}
        load = [os.getloadavg()[0]]
        for _ in range(args.rounds):
            for k, ks in steps.items():
                for i, (_, fn) in enumerate(ks):
                    t = time.process_time()
                    fn()
                    best[k][i] = min(best[k][i], time.process_time() - t)
        load.append(os.getloadavg()[0])
        print(f"== {name} b{args.batch}, old = {old}, {args.rounds} rounds, load {load[0]:.1f}-{load[1]:.1f}")
        kinds: dict[str, dict[str, float]] = {}
        for k, ks in steps.items():
            by: dict[str, float] = defaultdict(float)
            for (kname, _), t in zip(ks, best[k], strict=True):
                m = re.match(r"[A-Z0-9]+", kname)
                by[m.group(0) if m else kname] += t * 1e3
            kinds[k] = by
            print(f"{k}: {len(ks)} kernels, {sum(best[k]) * 1e3:.1f} ms CPU (sum of per-kernel minima)")
        names = set(kinds["new"]) | set(kinds["old"])
        moved = sorted(names, key=lambda n: -abs(kinds["new"].get(n, 0.0) - kinds["old"].get(n, 0.0)))
        print(
            "by kind, old -> new ms: "
            + "; ".join(f"{n} {kinds['old'].get(n, 0.0):.1f} -> {kinds['new'].get(n, 0.0):.1f}" for n in moved)
        )


if __name__ == "__main__":
    main()
