"""The stem kernel of a benchmark CNN's twin timed inside whole replays (where its image and output buffer come from
memory, not from the cache a one-layer loop leaves them in), for plans whose kernel sources differ by replacements:
plan "tree" as the tree builds it, each --variant NAME OLD NEW [OLD NEW ...] the same twin with those replacements in
every kernel source (outputs checked to match). Whole replays of the plans alternate, order reversed every round;
each launch is timed by the calling thread's CPU time (one thread) or wall time (more). Prints the stem's (the direct
kernel's) median and fewest ms and the whole replay's median per plan:

    PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_stem_net_ab.py alexnet --rounds 15 \
        --variant no-prefetch "plait_dc_prefetch(X," "if (0) plait_dc_prefetch(X,"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", os.environ.get("PLAIT_NUM_THREADS", "1"))
os.environ.setdefault("PLAIT_NUM_THREADS", os.environ["OMP_NUM_THREADS"])

import numpy as np

import plait.runtime.cpu as cpu

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, twin


def build(model: str, x: np.ndarray, pairs: list[tuple[str, str]]) -> tuple[object, np.ndarray]:
    """(plan, output) of the twin with every kernel source compiled after the replacements `pairs`."""
    batch, one = cpu.CPUDevice.compile_batch, cpu.CPUDevice.compile

    def patch(source: str) -> str:
        for old, new in pairs:
            source = source.replace(old, new)
        return source

    cpu.CPUDevice.compile_batch = lambda self, ks: batch(self, [(patch(s), n) for s, n in ks])  # type: ignore[method-assign]
    cpu.CPUDevice.compile = lambda self, s, n: one(self, patch(s), n)  # type: ignore[method-assign]
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        return f.plan_for([x])[0], y
    finally:
        cpu.CPUDevice.compile_batch, cpu.CPUDevice.compile = batch, one  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--variant", nargs="+", action="append", default=[], metavar="NAME OLD NEW")
    ap.add_argument("--unchecked", action="store_true", help="timing-only variants: skip the output check")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans, ref = {}, None
    for spec in [["tree"], *args.variant]:
        name, rest = spec[0], spec[1:]
        plan, y = build(args.model, x, list(zip(rest[::2], rest[1::2], strict=True)))
        if ref is None:
            ref = y
        assert args.unchecked or np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max(), f"{name}: output differs"
        plans[name] = plan
    one = os.environ["PLAIT_NUM_THREADS"] == "1"
    clock = time.thread_time if one else time.perf_counter
    stem: dict[str, list[float]] = {k: [] for k in plans}
    whole: dict[str, list[float]] = {k: [] for k in plans}
    first = next(iter(plans.values()))
    at = next(i for i, k in enumerate(first.kernels) if "plait_conv_d" in k.source)  # type: ignore[attr-defined]
    for r in range(args.rounds + 1):
        for name in list(plans) if r % 2 == 0 else list(plans)[::-1]:
            times = []
            for launch in plans[name].launches:  # type: ignore[attr-defined]
                t0 = clock()
                launch()
                times.append(clock() - t0)
            if r:
                stem[name].append(times[at] * 1e3)
                whole[name].append(sum(times) * 1e3)
    print(f"{args.model} b{args.batch}, {os.environ['PLAIT_NUM_THREADS']} thread(s), load {os.getloadavg()[0]:.2f}")
    for name in plans:
        s, w = stem[name], whole[name]
        print(
            f"  {name:14s} stem median {statistics.median(s):7.3f} best {min(s):7.3f} ms;"
            f" whole replay median {statistics.median(w):8.2f} ms"
        )


if __name__ == "__main__":
    main()
