"""Per-kernel report of the whole compiled training step that `plait bench --modes train` times (forward, loss,
backward and the SGD update, as `plait.compile_step` replays it): every launch timed alone on the device, summed
by kernel kind and listed slowest first, so the update's launches show beside the backward's.

    python benchmarks/profile_step.py --models resnet18 --batch 64 --device opencl:0 --limit 40
    python benchmarks/profile_step.py --models cifar_cnn --batch 2 --device cpu --image 32
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import time
from collections import defaultdict

import numpy as np


def _kind(name: str) -> str:
    """A kernel's kind from its name: the leading upper-case word (GEMM3XTF32, E, R, IM2COL, ...)."""
    m = re.match(r"[A-Z0-9]+", name)
    return m.group(0) if m else name


def main() -> None:
    import torch

    from plait.bench.models import get
    from plait.bench.runners import Case, PlaitRunner
    from plait.runtime import get_device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--image", type=int, default=0, help="square image side instead of the model's own (quick checks)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--limit", type=int, default=40, help="launches listed per model (slowest first)")
    ap.add_argument("--dump", default="", help="folder to write the listed kernels' sources into")
    args = ap.parse_args()
    dev = get_device(args.device)
    for name in args.models.split(","):
        spec = get(name)
        if args.image:
            spec = dataclasses.replace(spec, sample_shape=(spec.sample_shape[0], args.image, args.image))
        torch.manual_seed(0)
        ref = spec.torch_factory()
        x_np, y_np = spec.inputs(args.batch)
        runner = PlaitRunner(args.device)
        case = Case(spec, "train", args.batch, x_np, y_np, ref)
        model = runner._model(case).train()
        step = runner._train_step(model, case)
        import plait

        x = plait.Tensor.from_numpy(x_np, device=args.device)
        y = plait.Tensor.from_numpy(y_np, device=args.device)
        for _ in range(4):  # eager, two traced calls, then a replay
            step(x, y)
        replay = next(t.replay for t in step.traces.values() if t.replay is not None)
        dev.synchronize()
        whole = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            step(x, y)
            dev.synchronize()
            whole.append(time.perf_counter() - t0)
        launches = replay.keep.launches
        # each kernel bound on its own: the replay's launches may be chains of several (one cpu parallel region)
        alone = [la.program.bind(la.buffers, la.kernel.global_size, la.kernel.local_size) for la in launches]
        times = [sorted(dev.time_launch(b) for _ in range(args.reps))[args.reps // 2] for b in alone]
        total = sum(times)
        by_kind: dict[str, list[float]] = defaultdict(list)
        for la, t in zip(launches, times, strict=True):
            by_kind[_kind(la.kernel.name)].append(t)
        print(
            f"== {name} b{args.batch} {spec.sample_shape} on {args.device}: {len(times)} launches, "
            f"{total * 1e3:.3f} ms in kernels, {sorted(whole)[len(whole) // 2] * 1e3:.3f} ms per step replay"
        )
        kinds = sorted(by_kind.items(), key=lambda kv: -sum(kv[1]))
        print("by kind: " + "; ".join(f"{k} {sum(v) * 1e3:.3f} ms ({len(v)})" for k, v in kinds))
        order = np.argsort(times)[::-1]
        print("| # | kernel | global | local | ms | %time |")
        print("|---|---|---|---|---|---|")
        for i in order[: args.limit]:
            la = launches[i]
            print(
                f"| {i} | {la.kernel.name} | {la.kernel.global_size} | {la.kernel.local_size} | "
                f"{times[i] * 1e3:.3f} | {100 * times[i] / total:.1f} |"
            )
            if args.dump:
                folder = pathlib.Path(args.dump) / name
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"{i:04d}_{la.kernel.name}.cl").write_text(la.kernel.source)
        small = [t for t in times if t < 10e-6]
        print(f"{len(small)} launches under 10 us: {sum(small) * 1e3:.3f} ms")
        families: dict[str, list[float]] = defaultdict(list)
        for la, t in zip(launches, times, strict=True):
            families[la.kernel.name.rsplit("_", 1)[0]].append(t)
        top = sorted(families.items(), key=lambda kv: -sum(kv[1]))[: args.limit // 2]
        print(
            "by kernel (same name but the hash): " + "; ".join(f"{k} {sum(v) * 1e3:.3f} ms ({len(v)})" for k, v in top)
        )
        state = {id(w) for _, w in replay.carries}
        upd = [i for i, la in enumerate(launches) if id(la.buffers[0]) in state]
        upd_ms = sum(times[i] for i in upd) * 1e3
        print(f"{len(upd)} launches write carried state (parameters, momenta, running statistics): {upd_ms:.3f} ms")


if __name__ == "__main__":
    main()
