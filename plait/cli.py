"""The `plait` command: devices, run (ONNX models), bench, tune.

Errors that are the user's to fix (a bad flag, an unknown model, a missing file) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from plait.errors import PlaitError


def _devices(args: argparse.Namespace) -> int:
    from plait.runtime.discovery import list_devices

    rows = list_devices(measure=not args.no_measure)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    from plait.runtime import default_device

    default = default_device()
    for r in rows:
        if r["usable"]:
            mark = " (default)" if r["name"] == default else ""
            peak = f", peak {r['peak_gflops']} GFLOP/s, {r['peak_gbps']} GB/s" if "peak_gflops" in r else ""
            print(
                f"{r['name']}{mark}: {r['kind']} | {r['device']} | {r['compute_units']} compute units, "
                f"{r['memory_gib']} GiB{peak} | {r['driver']}"
            )
        else:
            print(f"{r['name']}: UNUSABLE - {r['reason']}")
    return 0


def _tune(args: argparse.Namespace) -> int:
    from plait.codegen.gemm import GemmSpec
    from plait.runtime import get_device
    from plait.tune import tune_gemm

    if args.model:
        return _tune_models(args)
    dev = get_device(args.device or _default())
    for n in args.sizes or [256, 512, 1024]:
        spec = GemmSpec(1, n, n, n, (0, 0, n, 1), (0, 0, n, 1))
        print(f"{dev.name}: gemm {n}x{n}x{n} -> {tune_gemm(dev, spec)}")
    return 0


def _tune_models(args: argparse.Namespace) -> int:
    """Tune every product of each model's inference plan within the budget, then time a replay before and after."""
    import plait
    from plait.bench.models import get
    from plait.bench.timing import measure
    from plait.tune.model import tune_plan

    device = args.device or _default()

    def replay_ms(plan: Any) -> float:
        return float(measure(plan.run, plan.device.synchronize, warmup=1, iters=5)["median_ms"])

    for name in args.model.split(","):
        spec = get(name.strip())
        net = spec.plait_factory(device).eval()
        x, _ = spec.inputs(args.batch)
        f = plait.jit(net, device=device)
        f(x)
        plan, _ = f.plan_for([x])
        before = replay_ms(plan)
        report = tune_plan(plan, args.budget)
        print(report.summary())
        g = plait.jit(net, device=device)
        g(x)
        after = replay_ms(g.plan_for([x])[0])
        print(f"{name} batch {args.batch} on {device}: replay {before:.2f} ms before, {after:.2f} ms after tuning")
    return 0


def _default() -> str:
    from plait.runtime import default_device

    return default_device()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="plait", description="plait: a portable deep-learning compiler and runtime")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("devices", help="list devices, usable or not (with the reason), with a measured peak")
    d.add_argument("--json", action="store_true", help="print JSON")
    d.add_argument("--no-measure", action="store_true", help="skip the peak GFLOP/s and GB/s measurement")
    d.set_defaults(fn=_devices)
    t = sub.add_parser("tune", help="search GEMM knobs on a device and cache the winners")
    t.add_argument("--device", default=None)
    t.add_argument("--sizes", type=int, nargs="+", default=None, help="square GEMM sizes (default 256 512 1024)")
    t.add_argument("--model", default=None, help="bench model(s), comma-separated: tune every product of the plan")
    t.add_argument("--batch", type=int, default=1, help="--model: the batch size to tune for")
    t.add_argument("--budget", type=float, default=60.0, help="--model: seconds of search per model (default 60)")
    t.set_defaults(fn=_tune)
    from plait.bench.cli import add_parser as add_bench

    add_bench(sub)
    try:
        from plait.onnx.cli import add_parser as add_run
    except ImportError:
        pass
    else:
        add_run(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except PlaitError as e:
        print(f"plait {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
