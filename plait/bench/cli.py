"""`plait bench`: the cross-framework matrix and the Microsoft benchmark tasks; writes JSON, markdown, PNG and HTML.

    plait bench --quick --out bench-results
    plait bench --models resnet18,gru --modes infer-1,train --frameworks plait,torch,onnxruntime
    plait bench --tasks cifar,imdb --cifar ~/data/cifar-10-batches-py --imdb ~/data/imdb.npz
    plait bench --quick --check bench-results/results.json
    plait bench --models resnet18 --modes infer-1 --frameworks plait --kernels

User errors (an unknown name, a missing or malformed file) print one line and exit 2; --check exits 1 when it
finds a regression.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from plait.bench import env
from plait.bench.models import MODELS, QUICK_MODELS, QUICK_MODES, BenchError
from plait.bench.runners import FRAMEWORKS
from plait.bench.tasks import TASKS

# torch.compile is left out of the quick matrix: inductor takes minutes per model to compile on a 2-core machine.
QUICK_FRAMEWORKS = ("plait", "torch", "onnxruntime")
MODES = ("infer-1", "infer-batch", "train")


def add_parser(sub: Any) -> None:
    b = sub.add_parser("bench", help="benchmark plait against other frameworks (outputs checked before timing)")
    b.add_argument("--quick", action="store_true", help="the quick default matrix (what `make bench` runs)")
    b.add_argument("--models", help=f"comma-separated, or 'all': {', '.join(MODELS)}")
    b.add_argument("--modes", help=f"comma-separated: {', '.join(MODES)} (default: all)")
    b.add_argument("--frameworks", help=f"comma-separated: {', '.join(FRAMEWORKS)}")
    b.add_argument(
        "--device",
        help="plait device(s), comma-separated (default: the default device with --quick, else every usable one)",
    )
    b.add_argument("--torch-device", help="device for PyTorch and ONNX Runtime (default: cuda if available, else cpu)")
    b.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads for every framework")
    b.add_argument("--batch", type=int, help="the larger batch for every model (default: per model)")
    b.add_argument("--warmup", type=int, help="untimed runs after the checked first call (default 2, 1 with --quick)")
    b.add_argument("--iters", type=int, help="timed iterations per cell (default 10, 5 with --quick)")
    b.add_argument(
        "--max-seconds", type=float, help="stop a cell's timing after this, min 3 iterations (default 20, 5 quick)"
    )
    b.add_argument("--seed", type=int, default=0)
    b.add_argument(
        "--tasks",
        help=f"comma-separated Microsoft benchmark tasks, or 'none': {', '.join(TASKS)} "
        "(default: all, none with --quick)",
    )
    b.add_argument("--cifar", help="folder with CIFAR-10's python batches (cifar-10-batches-py); default: generated")
    b.add_argument("--imdb", help="Keras' imdb.npz; default: generated data of the same shape")
    b.add_argument(
        "--train-samples", type=int, help="training samples per task epoch (default: 1024 generated, all real)"
    )
    b.add_argument("--epochs", type=int, default=1)
    b.add_argument("--feature-images", type=int, default=256, help="images for the ResNet-50 feature task")
    b.add_argument("--tf32", action="store_true", help="allow TF32 in PyTorch (off by default: float32 everywhere)")
    b.add_argument("--cudnn-benchmark", action="store_true", help="set torch.backends.cudnn.benchmark")
    b.add_argument("--out", default="bench-results", help="folder for results.json/.md, plots and report.html")
    b.add_argument("--check", metavar="REFERENCE.json", help="compare with a saved results.json; exit 1 on regression")
    b.add_argument("--threshold", type=float, default=0.10, help="--check: slowdown that counts as a regression")
    b.add_argument(
        "--kernels",
        action="store_true",
        help="per-kernel report (time, GFLOP/s, GB/s, %% of measured peak) for plait and plait-onnx inference cells,"
        " into results.json, results.md and kernels.md",
    )
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    b.set_defaults(fn=run)


def _choose(value: str | None, known: tuple[str, ...] | list[str], default: tuple[str, ...], what: str) -> list[str]:
    if value is None:
        return list(default)
    if value.strip() == "all":
        return list(known)
    if value.strip() == "none":
        return []
    names = [v.strip() for v in value.split(",") if v.strip()]
    for n in names:
        if n not in known:
            raise BenchError(f"unknown {what} {n!r}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


def _plait_devices(value: str | None, quick: bool) -> list[str]:
    from plait.runtime import canonical, default_device
    from plait.runtime.discovery import usable_devices

    if value:
        return [canonical(d) for d in value.split(",") if d.strip()]
    return [default_device()] if quick else usable_devices()


def _validate_paths(args: argparse.Namespace) -> None:
    if args.cifar and not Path(args.cifar).exists():
        raise BenchError(f"--cifar {args.cifar}: no such folder")
    if args.imdb and not Path(args.imdb).exists():
        raise BenchError(f"--imdb {args.imdb}: no such file")
    if args.check and not Path(args.check).is_file():
        raise BenchError(f"--check {args.check}: no such file")
    for flag in ("threads", "warmup", "iters", "batch", "epochs", "feature_images", "train_samples"):
        v = getattr(args, flag)
        if v is not None and v < (0 if flag == "warmup" else 1):
            raise BenchError(f"--{flag.replace('_', '-')} must be positive, got {v}")


def run(args: argparse.Namespace) -> int:
    models = _choose(args.models, list(MODELS), QUICK_MODELS if args.quick else tuple(MODELS), "model")
    modes = _choose(args.modes, MODES, MODES, "mode")
    frameworks = _choose(args.frameworks, FRAMEWORKS, QUICK_FRAMEWORKS if args.quick else FRAMEWORKS, "framework")
    tasks = _choose(args.tasks, TASKS, () if args.quick else TASKS, "task")
    _validate_paths(args)
    thread_env = env.set_threads(args.threads)  # before torch or onnxruntime is imported
    from plait.bench import check, report
    from plait.bench import tasks as task_mod
    from plait.bench.matrix import TOLERANCES, Progress, Settings, run_matrix

    ts = task_mod.TaskSettings(
        args.cifar, args.imdb, args.train_samples, feature_images=args.feature_images, epochs=args.epochs
    )
    datasets = task_mod.load_datasets(tasks, ts, args.seed)
    reference = check.load_reference(args.check) if args.check else None
    devices = _plait_devices(args.device, args.quick)
    try:
        import torch
    except ImportError:
        raise BenchError(
            "plait bench needs PyTorch (the reference every output is checked against): pip install 'plait[torch]'"
        ) from None
    from plait.bench.models import get
    from plait.bench.runners import make_runners

    torch.set_num_threads(args.threads)
    torch_device = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_info = env.torch_settings(torch, args.tf32, args.cudnn_benchmark)
    runners = make_runners(frameworks, devices, args.threads, torch_device, kernels=args.kernels)
    s = Settings(
        warmup=args.warmup if args.warmup is not None else (1 if args.quick else 2),
        iters=args.iters or (5 if args.quick else 10),
        max_seconds=args.max_seconds or (5.0 if args.quick else 20.0),
        batch=args.batch,
        seed=args.seed,
    )
    specs = [get(m) for m in models]
    if args.quick:
        specs = [_quick(m, args.batch is None, args.modes is None) for m in specs]
    print(
        f"plait bench: {len(specs)} models x up to {len(modes)} modes x {len(runners)} frameworks on "
        f"{', '.join(devices)} (torch on {torch_device}, {args.threads} threads)"
    )
    t0 = time.perf_counter()
    load_start, pair_start, fma_start = env.load_average(), env.cpu_pair_ns(), env.cpu_pair_fma()
    n_cells = sum(len([m for m in modes if m in spec.modes]) for spec in specs) * len(runners)
    progress = Progress(n_cells, enabled=not args.no_progress)
    cells = run_matrix(specs, modes, runners, s, torch_device, progress)
    progress.close()
    task_rows = task_mod.run_tasks(tasks, datasets, runners, s, ts, torch_device)
    result = {
        "schema": 1,
        "cells": cells,
        "tasks": task_rows,
        "environment": env.environment(args.threads, devices),
        "load_average_start": load_start,
        "cpu_pair_ns_start": pair_start,
        "cpu_pair_fma_start": fma_start,
        "settings": {
            "command": "plait bench " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]),
            "dtype": "float32",
            "layout": "NCHW",
            "warmup": s.warmup,
            "iters": s.iters,
            "max_seconds": s.max_seconds,
            "seed": s.seed,
            "lr": s.lr,
            "batches": {m.name: m.batch for m in specs},
            "torch_device": torch_device,
            "torch": torch_info,
            "thread_env": thread_env,
            "tolerances": TOLERANCES,
            "dropout": "off in training steps (random, so no two frameworks could agree)",
            "tasks": {"names": tasks, **vars(ts)},
            "timing": "plait inference replays its compiled plan on device-resident input; torch and ONNX Runtime "
            "are called on host arrays (zero-copy on the CPU)",
            "kernel_report": args.kernels,
            "wall_s": round(time.perf_counter() - t0, 1),
        },
        "runners": {r.name: (r.info() if not r.unavailable() else {"unavailable": r.unavailable()}) for r in runners},
    }
    paths = report.write_all(result, Path(args.out))
    print(report.markdown(result))
    print(f"plait bench: wrote {', '.join(str(p) for p in paths.values())} in {time.perf_counter() - t0:.0f} s")
    if reference is not None:
        rows = check.compare(result, reference, args.threshold)
        print("\n".join(check.format_rows(rows, args.threshold)))
        return 1 if any(r["regression"] for r in rows) else 0
    return 0


def _quick(spec: Any, batch: bool, modes: bool) -> Any:
    """The quick matrix's smaller batch and, unless --modes was given, its modes for this model."""
    import dataclasses

    return dataclasses.replace(
        spec,
        batch=spec.quick_batch if batch else spec.batch,
        modes=QUICK_MODES.get(spec.name, spec.modes) if modes else spec.modes,
    )
