"""A 5x5 stride-1 training convolution on an OpenCL device, direct (implicit GEMM, columns product) against Winograd
F(2,5) and F(4,5) (plait/codegen/winograd_cl.py with r = 5, m = 2 or 4): the forward, the input gradient and the
weight gradient each compiled alone and profiled kernel by kernel (the device's profiling events), then the three in
one plan (where an F(2,5) forward takes the weight gradient's input transform), and each result's max error against
PyTorch in float64 relative to the reference's largest magnitude.

The default layer is alexnet's 5x5 one (64 -> 192 channels, 27x27, padding 2). The graph is that of
sum(conv2d(x, w, padding) * g) with x and w requiring gradients, as `_conv_vjp` builds it in a training step;
PLAIT_WINOGRAD_CL=off is the direct form, =2 F(2,5) everywhere, =4 F(4,5) everywhere.

    tools/gpu-run.sh python3 benchmarks/bench_winograd5_cl.py --device opencl:0 --batch 64
    PLAIT_TEST_DEVICES=opencl:0 python3 benchmarks/bench_winograd5_cl.py --batch 2 --reps 1   # rounding on PoCL

`--sweep` instead times the layer's F(2,5) products alone (the batched GEMMs of the three parts' plan, as the
scheduler lays them out, on random operands): the tile heuristic's knobs and every tensor-core candidate
(benchmarks/sweep_step_gemms.py's list), the weight gradient's product also in other K chunk counts (`--parts`);
with `--sweep-mode 4` the F(4,5) products (64 of them) instead:

    tools/gpu-run.sh python3 benchmarks/bench_winograd5_cl.py --sweep --parts 1 2 4 6 10
    tools/gpu-run.sh python3 benchmarks/bench_winograd5_cl.py --sweep --sweep-mode 4 --parts 2 3 4 6 8
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait import dtypes, settings
from plait.errors import PlaitError
from plait.graph import autodiff
from plait.graph.node import Node
from plait.schedule.plan import Plan
from plait.schedule.profile import profile_plan


def _graphs(device: str, c: int, k: int, hw: int, pad: int, batch: int, mode: str, seed: int = 0):
    """(out, dx, dw) nodes of the layer's training graph under PLAIT_WINOGRAD_CL=`mode`, its x, w and g input
    placeholders (so no transform of them is a plan constant, as in a training step) and their values."""
    rng = np.random.default_rng(seed)
    xa = rng.standard_normal((batch, c, hw, hw)).astype(np.float32)
    wa = (rng.standard_normal((k, c, 5, 5)) / np.sqrt(25 * c)).astype(np.float32)
    oh = hw + 2 * pad - 4
    ga = rng.standard_normal((batch, k, oh, oh)).astype(np.float32)
    inputs = [Node("input", (), None, a.shape, dtypes.float32, device) for a in (xa, wa, ga)]
    for node in inputs[:2]:
        node.rg = True
    x, w, g = (plait.Tensor(node) for node in inputs)
    with settings.override(PLAIT_WINOGRAD_CL=mode):
        out = F.conv2d(x, w, padding=pad)
        loss = (out * g).sum()
        seed_node = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
        grads = autodiff.gradients(loss.node, seed_node, [x.node, w.node])
    return (out.node, grads[x.node.uid], grads[w.node.uid]), inputs, (xa, wa, ga)


def _reference(xa: np.ndarray, wa: np.ndarray, ga: np.ndarray, pad: int) -> list[np.ndarray]:
    """PyTorch's output, input gradient and weight gradient in float64 (on CUDA where there is one)."""
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.tensor(xa, dtype=torch.float64, device=dev, requires_grad=True)
    w = torch.tensor(wa, dtype=torch.float64, device=dev, requires_grad=True)
    out = torch.nn.functional.conv2d(x, w, padding=pad)
    (out * torch.tensor(ga, dtype=torch.float64, device=dev)).sum().backward()
    assert x.grad is not None and w.grad is not None
    return [out.detach().cpu().numpy(), x.grad.cpu().numpy(), w.grad.cpu().numpy()]


def _kinds(plan: Plan, reps: int) -> tuple[float, str]:
    """Total median kernel time (seconds) of `plan` and its kernels' times by kind, e.g. 'WINOIN2R5 0.041'."""
    report = profile_plan(plan, reps=reps)
    by: dict[str, float] = defaultdict(float)
    for s in report.kernels:
        m = re.match(r"[A-Z0-9]+", s.name)
        by[m.group(0) if m else s.name] += s.time_s
    return sum(by.values()), ", ".join(f"{n} {t * 1e3:.3f}" for n, t in by.items())


def _products(device: str, c: int, k: int, hw: int, pad: int, batch: int, parts: int, mode: str = "2") -> list[Any]:
    """The distinct Winograd product GemmSpecs of the layer's three parts in one plan under PLAIT_WINOGRAD_CL=`mode`:
    with '2' the F(2,5) ones (batch a multiple of 36), with '4' the F(4,5) ones (64); the weight gradient's product
    in `parts` K chunks (the 64x64-tile target set to make that many, the shortest chunk to allow them)."""
    from plait.codegen import winograd_cl
    from plait.runtime import get_device
    from plait.schedule.scheduler import schedule

    r = get_device(device).renderer
    xis = 64 if mode == "4" else 36
    names = ("R45_WGRAD_TILE_TARGET", "R45_WGRAD_MIN_CHUNK") if mode == "4" else ("R5_WGRAD_TILE_TARGET",)
    saved = [getattr(winograd_cl, name) for name in names]
    setattr(winograd_cl, names[0], xis * -(-k // 64) * -(-c // 64) * parts)
    if mode == "4":
        setattr(winograd_cl, names[1], winograd_cl.WGRAD_CHUNK_UNIT)
    try:  # the graph's weight gradient makes its plan (and chunk count) as it is built
        nodes, _, _ = _graphs(device, c, k, hw, pad, batch, mode)
        with settings.override(PLAIT_WINOGRAD_CL=mode):
            items = schedule(
                list(nodes),
                r.__dict__.get("split_parts", 256),
                implicit_conv=getattr(r, "implicit_conv", False),
                conv_span=getattr(r, "conv_span", False),
                split_k=getattr(r, "split_k", False),
                winograd_cl=True,
            )
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(winograd_cl, name, value)
    specs = [it.gemm for it in items if it.kind == "gemm" and it.gemm is not None and it.gemm.batch % xis == 0]
    return list(dict.fromkeys(specs))


def time_tiles(dev: Any, sp: Any, reps: int) -> list[tuple[float, dict[str, int]]]:
    """(median seconds of `reps` timed launches, knobs) of product `sp` under the heuristic's knobs (first) and every
    tensor-core candidate tile; a tile the product cannot take is said and skipped."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sweep_step_gemms import _knobs
    from sweep_wgrad_cl import _buffers

    from plait.codegen import gemm
    from plait.codegen.gemm_tc import mma_tf32_unsupported

    emu = {"MMA": 0} if mma_tf32_unsupported(dev) else {}
    knobs, kernels = [], []
    for kn in _knobs(sp, dev.info.extra.get("local_mem", 48 * 1024)):
        try:
            kernels.append(gemm.render_opencl(sp, {**kn, **emu}))
            knobs.append(kn)
        except PlaitError as e:  # a tile this product cannot take: say so and go on
            print(f"   render {kn}: {str(e)[:80]}")
    progs = dev.compile_batch([(kern.source, kern.name) for kern in kernels])
    pool: dict[int, Any] = {}
    bufs = _buffers(dev, sp, pool)
    rows = []
    for kn, kern, prog in zip(knobs, kernels, progs, strict=True):
        launch = prog.bind(bufs, kern.global_size, kern.local_size)
        rows.append((sorted(dev.time_launch(launch) for _ in range(reps))[reps // 2], kn))
    for buf in pool.values():
        dev.allocator.free(buf.nbytes, buf.handle)
    return rows


def print_tiles(header: str, sp: Any, rows: list[tuple[float, dict[str, int]]], shown: int) -> None:
    """The heuristic's time, then the `shown` fastest tiles, with TFLOP/s."""
    print(header, flush=True)
    lines = [f"heuristic {rows[0][0] * 1e3:.3f} ms {sp.flops / rows[0][0] / 1e12:.1f} TF {rows[0][1]}"]
    lines += [f"{t * 1e3:.3f} ms {sp.flops / t / 1e12:.1f} TF {kn}" for t, kn in sorted(rows, key=lambda r: r[0])]
    print("   " + "\n   ".join(lines[: shown + 1]), flush=True)


def _sweep(args: argparse.Namespace, c: int, k: int, hw: int) -> None:
    """Time each F(2,5) (or, --sweep-mode 4, F(4,5)) product under the heuristic's knobs and every candidate (median
    of --reps events)."""
    from plait.runtime import get_device

    dev = get_device(args.device)
    start, seen = time.perf_counter(), set()
    for parts in args.parts:
        for sp in _products(args.device, c, k, hw, args.pad, args.batch, parts, args.sweep_mode):
            if sp in seen:
                continue
            seen.add(sp)
            if time.perf_counter() - start > args.seconds:
                print("-- stopped: --seconds reached", flush=True)
                return
            rows = time_tiles(dev, sp, args.reps)
            print_tiles(f"-- {sp.batch}x{sp.m}x{sp.n}x{sp.k} a={sp.a} b={sp.b} inner={sp.inner}", sp, rows, 6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--layer", default="64x192x27", help="CxKxHW of the 5x5 layer (padding 2)")
    ap.add_argument("--pad", type=int, default=2)
    ap.add_argument("--sweep", action="store_true", help="time the F(2,5) products alone under tiles and chunks")
    ap.add_argument("--sweep-mode", default="2", choices=("2", "4"), help="--sweep: F(2,5) or F(4,5) products")
    ap.add_argument("--modes", default="off,2,4", help="PLAIT_WINOGRAD_CL values to time (comma-separated)")
    ap.add_argument("--parts", nargs="*", type=int, default=[10], help="--sweep: weight-gradient K chunk counts")
    ap.add_argument("--seconds", type=float, default=150.0, help="--sweep: stop starting new products after this")
    args = ap.parse_args()
    c, k, hw = (int(v) for v in args.layer.split("x"))
    if args.sweep:
        _sweep(args, c, k, hw)
        return
    print(f"5x5 layer {c} -> {k} at {hw}x{hw}, padding {args.pad}, batch {args.batch}; median of {args.reps} (ms)")
    print("| part | mode | kernel time | kernels | max error / max |")
    print("|---|---|---|---|---|")
    for mode in args.modes.split(","):
        nodes, inputs, data = _graphs(args.device, c, k, hw, args.pad, args.batch, mode)
        refs = _reference(*data, args.pad)
        for name, node, ref in zip(("forward", "input gradient", "weight gradient"), nodes, refs, strict=True):
            with settings.override(PLAIT_WINOGRAD_CL=mode):
                plan = Plan([node], inputs)
            (got,) = plan(*data)
            err = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
            total, kinds = _kinds(plan, args.reps)
            print(f"| {name} | {mode} | {total * 1e3:.3f} | {kinds} | {err:.2e} |", flush=True)
        with settings.override(PLAIT_WINOGRAD_CL=mode):
            plan = Plan(list(nodes), inputs)
        plan(*data)
        total, kinds = _kinds(plan, args.reps)
        print(f"| all three, one plan | {mode} | {total * 1e3:.3f} | {kinds} | |", flush=True)


if __name__ == "__main__":
    main()
