"""torch.compile(backend="plait") against eager PyTorch and torch.compile's default backend (inductor).

For each net and batch: first-call time (trace + compile + one run) and the median ms per batch over --iters timed
calls after warm-up, in inference mode on the same weights and inputs; outputs are checked against eager before any
time is reported. One run covers every configuration, so the ratios compare like with like.

    .venv/bin/python benchmarks/bench_torch_compile.py --device cpu --batches 1 16 --iters 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from typing import Any

import torch

from plait.models import torch_reference

NETS = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2")


def _time(fn: Any, x: torch.Tensor, warmup: int, iters: int) -> tuple[float, float, torch.Tensor]:
    """(first call seconds, median ms of the timed calls, first output)."""
    t0 = time.perf_counter()
    out = fn(x)
    first = time.perf_counter() - t0
    for _ in range(warmup):
        fn(x)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1000)
    return first, statistics.median(times), out


def bench(name: str, batch: int, device: str, size: int, warmup: int, iters: int) -> dict[str, Any]:
    torch.manual_seed(0)
    net = torch_reference.build(name).eval()
    x = torch.randn(batch, 3, size, size)
    row: dict[str, Any] = {"model": name, "batch": batch, "size": size}
    with torch.no_grad():
        _, eager_ms, want = _time(net, x, warmup, iters)
        row["eager_ms"] = eager_ms
        for label, backend, kw in (
            ("inductor", "inductor", {}),
            ("plait", "plait", {"options": {"device": device}}),
        ):
            torch._dynamo.reset()
            compiled = torch.compile(net, backend=backend, **kw)
            first, ms, got = _time(compiled, x, warmup, iters)
            err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
            if err > 1e-3:
                raise SystemExit(f"{label} {name} batch {batch}: outputs differ from eager (relative {err:.2e})")
            row[f"{label}_first_s"], row[f"{label}_ms"], row[f"{label}_err"] = first, ms, err
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", nargs="+", default=list(NETS))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    env = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "plait_device": args.device,
        "dtype": "float32",
        "warmup": args.warmup,
        "iters": args.iters,
    }
    print("# " + json.dumps(env))
    print("| model | batch | eager ms | inductor first s | inductor ms | plait first s | plait ms | plait / eager |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for name in args.models:
        for b in args.batches:
            r = bench(name, b, args.device, args.size, args.warmup, args.iters)
            rows.append(r)
            print(
                f"| {name} | {b} | {r['eager_ms']:.1f} | {r['inductor_first_s']:.1f} | {r['inductor_ms']:.1f} |"
                f" {r['plait_first_s']:.1f} | {r['plait_ms']:.1f} | {r['plait_ms'] / r['eager_ms']:.2f} |",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
