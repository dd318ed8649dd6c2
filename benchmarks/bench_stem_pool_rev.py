"""The fused stem and max pool kernel (plait/codegen/stem_pool_c.py) of this tree against the same file at an
earlier git revision, inside whole replays of a benchmark CNN's twin: the twin built twice in one process, once
with the revision's `stem_pool_c.render` in place of this tree's, whole replays alternating (order reversed every
round), each launch timed by the calling thread's CPU time (one thread) or wall time (more). Prints the fused
kernel's median and fewest ms and the whole replay's median per plan, with the load and the hypervisor's steal
share over the run:

    PLAIT_NUM_THREADS=1 .venv/bin/python benchmarks/bench_stem_pool_rev.py resnet18 4f0fd7b --batch 1 --rounds 21
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

from plait.codegen import stem_pool_c

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, twin
from bench_stem_pool_ab import steal
from rev_module import module_at


def build(model: str, x: np.ndarray, render: object, pack: bool) -> tuple[object, np.ndarray, int]:
    """(plan, output, index of the fused kernel) of the twin with `render` rendering the fused kernel, its weights
    packed at plan build (`pack`, this tree's scheduler) or as the kernel's input (a revision before that)."""
    keep, packable = stem_pool_c.render, stem_pool_c.packable
    stem_pool_c.render = render  # type: ignore[assignment]
    stem_pool_c.packable = packable if pack else lambda spec: False  # type: ignore[assignment]
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        plan = f.plan_for([x])[0]
    finally:
        stem_pool_c.render, stem_pool_c.packable = keep, packable  # type: ignore[assignment]
    at = next(i for i, k in enumerate(plan.kernels) if "plait_conv_dlpool_" in k.source)  # type: ignore[attr-defined]
    return plan, y, at


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("rev", help="git revision of the other stem_pool_c.py")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--rev-packs", action="store_true", help="the revision's kernel reads weights packed at build")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans = {}
    for name, render, pack in (
        ("tree", stem_pool_c.render, True),
        (args.rev, module_at(args.rev, "plait/codegen/stem_pool_c.py", "stem_pool_old").render, args.rev_packs),
    ):
        plans[name] = build(args.model, x, render, pack)
    ref = plans["tree"][1]
    for name, (_, y, _) in plans.items():
        assert np.array_equal(np.isnan(y), np.isnan(ref)), f"{name}: NaNs differ"
        assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max(), f"{name}: output differs"
    clock = time.thread_time if os.environ["PLAIT_NUM_THREADS"] == "1" else time.perf_counter
    part: dict[str, list[float]] = {k: [] for k in plans}
    whole: dict[str, list[float]] = {k: [] for k in plans}
    s0, t0 = steal(), time.monotonic()
    for r in range(args.rounds + 1):
        for name in list(plans) if r % 2 == 0 else list(plans)[::-1]:
            plan, _, at = plans[name]
            times = []
            for launch in plan.launches:  # type: ignore[attr-defined]
                c0 = clock()
                launch()
                times.append(clock() - c0)
            if r:
                part[name].append(times[at] * 1e3)
                whole[name].append(sum(times) * 1e3)
    lost = (steal() - s0) / (100 * (os.cpu_count() or 1) * (time.monotonic() - t0))
    print(
        f"{args.model} b{args.batch}, {os.environ['PLAIT_NUM_THREADS']} thread(s), load {os.getloadavg()[0]:.2f}, "
        f"steal {lost:.1%}"
    )
    for name in plans:
        p, w = part[name], whole[name]
        print(
            f"  {name:10s} stem + pool median {statistics.median(p):7.3f} fewest {min(p):7.3f} ms;"
            f" whole replay median {statistics.median(w):8.2f} ms"
        )


if __name__ == "__main__":
    main()
