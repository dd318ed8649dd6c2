"""Per-layer time of a training convolution's weight gradient on an OpenCL device: the direct product (dy @ columns^T
in K chunks, the columns gathered from the image) against Winograd F(2,3) (`winograd_cl.wgrad_plan`: dy's and x's
tile transforms, 16 batched products in K chunks, the chunks' sum and the output transform), each kernel timed on
its own by the device's profiling events, and the two results compared with each other.

The graph is the weight gradient of sum(conv2d(x, w, padding=1) * g) alone (as `_conv_vjp` builds it in a training
step), compiled with PLAIT_WINOGRAD_CL=off (direct) and =2 (Winograd), run once, then profiled.

    tools/gpu-run.sh python3 benchmarks/bench_wgrad_winograd_cl.py --device opencl:0 --batch 64
    python3 benchmarks/bench_wgrad_winograd_cl.py --device opencl:0 --batch 2 --layers 16x16x8 --targets 1056 2112

`--targets` times Winograd once per value of `winograd_cl.WGRAD_TILE_TARGET` (the 64x64 tiles its K chunks aim for).
`--sweep` instead times each layer's batched Winograd product alone (random operands, profiling events) under the
tile heuristic's knobs and tensor-core tiles from 64x64 to 256x128, each with the rule's K chunks, twice and
four times as many:

    tools/gpu-run.sh python3 benchmarks/bench_wgrad_winograd_cl.py --sweep --layers 128x128x112 512x512x28

`--step MODELS` instead times whole training steps in one process, in turns (round robin), against PyTorch's on
CUDA (float32, TF32 off, cudnn.benchmark): plait's step under the rule, and for each `--below` value N the same step
with the weight gradients of layers under N tiles kept direct:

    tools/gpu-run.sh python3 benchmarks/bench_wgrad_winograd_cl.py --step cifar_cnn,resnet18 --below 2048
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

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen import gemm, winograd_cl
from plait.graph import autodiff
from plait.graph.ops.conv import Window
from plait.schedule.plan import Plan
from plait.schedule.profile import profile_plan

LAYERS = [  # C, K, HxW: vgg16's 3x3 layers with 128+ channels, then resnet18/50's 3x3 stride-1 ones
    (128, 128, 112),
    (128, 256, 56),
    (256, 256, 56),
    (256, 512, 28),
    (512, 512, 28),
    (512, 512, 14),
    (64, 64, 56),
    (128, 128, 28),
    (256, 256, 14),
    (512, 512, 7),
]


def _wgrad(device: str, c: int, k: int, hw: int, batch: int, mode: str, reps: int) -> tuple[np.ndarray, dict]:
    """The weight gradient under PLAIT_WINOGRAD_CL=`mode` and its kernels' median times (seconds) by kind."""
    rng = np.random.default_rng(0)
    x = plait.tensor(rng.standard_normal((batch, c, hw, hw)).astype(np.float32), device=device, requires_grad=True)
    w = plait.tensor((rng.standard_normal((k, c, 3, 3)) * 0.05).astype(np.float32), device=device, requires_grad=True)
    g = plait.tensor(rng.standard_normal((batch, k, hw, hw)).astype(np.float32), device=device)
    with settings.override(PLAIT_WINOGRAD_CL=mode):
        loss = (F.conv2d(x, w, padding=1) * g).sum()
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
        node = autodiff.gradients(loss.node, seed, [w.node])[w.node.uid]
        plan = Plan([node])
    out = plan()[0]
    report = profile_plan(plan, reps=reps)
    by: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for s in report.kernels:
        m = re.match(r"[A-Z0-9]+", s.name)
        by[m.group(0) if m else s.name][0] += s.time_s
        by[m.group(0) if m else s.name][1] += 1
    return out, dict(by)


SWEEP_TILES = [  # tensor-core tiles tried on the Winograd weight gradient's products (with BK 16+ also KS 2)
    {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32},
    {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64},
    {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32},
    {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64},
    {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 32, "WN": 64},
    {"V": 3, "BM": 128, "BN": 256, "BK": 8, "WM": 64, "WN": 64},
    {"V": 3, "BM": 256, "BN": 128, "BK": 8, "WM": 64, "WN": 64},
]


def _product(c: int, k: int, hw: int, batch: int, parts: int) -> gemm.GemmSpec:
    """The batched product D[xi] @ V[xi]^T of a `hw` x `hw` layer's weight gradient in `parts` K chunks, with the
    strides the scheduler gives the matmul `winograd_cl_wgrad` builds (both operands (16, rows, tp))."""
    p = winograd_cl.WinogradCLPlan(
        batch, c, k, hw, hw, hw, hw, 1, 1, (0, c * hw * hw), (0, 0, 1), pad=winograd_cl.WGRAD_CHUNK_UNIT * parts
    )
    tp, kc = p.tp, p.tp // parts
    if parts == 1:
        return gemm.GemmSpec(16, k, c, kc, (0, 0, kc, 1), (0, 0, 1, kc), 16, k * kc, c * kc)
    return gemm.GemmSpec(16 * parts, k, c, kc, (0, k * tp, tp, 1), (0, c * tp, 1, tp), parts, kc, kc)


def _sweep(device: str, layers: list[tuple[int, ...]], batch: int, reps: int, seconds: float) -> None:
    """Time each layer's Winograd product alone under SWEEP_TILES and the heuristic, for several K chunk counts."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sweep_wgrad_cl import _buffers

    from plait.codegen.gemm_tc import local_bytes, mma_tf32_unsupported
    from plait.runtime import get_device
    from plait.tune import _tc_heuristic

    dev = get_device(device)
    emu = {"MMA": 0} if mma_tf32_unsupported(dev) else {}
    have = dev.info.extra.get("local_mem", 48 * 1024)
    start = time.perf_counter()
    for c, k, hw in layers:
        plan = winograd_cl.wgrad_plan(Window(batch, c, hw, hw, 3, 3, 1, 1, 1, 1), k)
        rule = plan.parts if plan is not None else 1
        for parts in (rule, 2 * rule, 4 * rule):
            if time.perf_counter() - start > seconds:
                print("-- stopped: --seconds reached", flush=True)
                return
            spec = _product(c, k, hw, batch, parts)
            knobs: list[dict[str, Any]] = [_tc_heuristic(spec)]
            for t in SWEEP_TILES + [{**t, "KS": 2} for t in SWEEP_TILES if t["BK"] % 16 == 0]:
                if t not in knobs and local_bytes(t) <= have:
                    knobs.append(t)
            kernels = [gemm.render_opencl(spec, {**kn, **emu}) for kn in knobs]
            progs = dev.compile_batch([(kern.source, kern.name) for kern in kernels])
            pool: dict[int, Any] = {}
            bufs = _buffers(dev, spec, pool)
            rows = []
            for kn, kern, prog in zip(knobs, kernels, progs, strict=True):
                launch = prog.bind(bufs, kern.global_size, kern.local_size)
                rows.append((sorted(dev.time_launch(launch) for _ in range(reps))[reps // 2], kn))
            for buf in pool.values():
                dev.allocator.free(buf.nbytes, buf.handle)
            mark = " (rule)" if parts == rule else ""
            print(
                f"-- {c}x{k}x{hw} b{batch}: {parts} chunks{mark}, {spec.batch}x{spec.m}x{spec.n}x{spec.k}", flush=True
            )
            lines = [f"heuristic {rows[0][0] * 1e3:.3f} ms {spec.flops / rows[0][0] / 1e12:.1f} TF {rows[0][1]}"]
            lines += [
                f"{t * 1e3:.3f} ms {spec.flops / t / 1e12:.1f} TF {kn}" for t, kn in sorted(rows, key=lambda r: r[0])
            ]
            print("   " + "\n   ".join(lines[:8]), flush=True)


def _plait_step(name: str, batch: int, device: str, below: int) -> Any:
    """A replaying compiled training step of `name` whose Winograd weight gradients skip layers under `below` tiles
    (0: the rule as it is); the choice is made while the step is traced."""
    sys.path.insert(0, str(Path(__file__).parent))
    from train_step_ab import plait_step

    rule = F.wgrad_plan

    def narrowed(win: Window, k: int) -> winograd_cl.WinogradCLPlan | None:
        plan = rule(win, k)
        return None if plan is None or plan.tiles < below else plan

    F.wgrad_plan = narrowed
    try:
        return plait_step(name, batch, device, [])[0]
    finally:
        F.wgrad_plan = rule


def _torch_step(name: str, batch: int) -> Any:
    """PyTorch's training step of `name` on CUDA (float32, TF32 off, cudnn.benchmark), synchronised by `.item()`."""
    import torch

    from plait.bench.models import get

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    spec = get(name)
    torch.manual_seed(0)
    model = spec.torch_factory().cuda().train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0  # as plait's step in train_step_ab
    x_np, y_np = spec.inputs(batch)
    x, y = torch.from_numpy(x_np).cuda(), torch.from_numpy(y_np).long().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.item())

    for _ in range(3):
        step()
    return step


def _steps(models: list[str], batch: int, device: str, belows: list[int], rounds: int, iters: int) -> None:
    """Median step times (ms) of the rule, each `belows` variant and torch, timed in turns."""
    for name in models:
        steps = {"rule": _plait_step(name, batch, device, 0)}
        steps.update({f"below {b}": _plait_step(name, batch, device, b) for b in belows})
        steps["torch"] = _torch_step(name, batch)
        times: dict[str, list[float]] = defaultdict(list)
        for _ in range(rounds):
            for key, f in steps.items():
                f()
                t = time.perf_counter()
                for _ in range(iters):
                    f()
                times[key].append((time.perf_counter() - t) * 1e3 / iters)
        print(f"== {name} b{batch} on {device}: {rounds} rounds of {iters} steps, median ms (min-max of rounds)")
        med = {k: float(np.median(v)) for k, v in times.items()}
        for key, v in times.items():
            print(f"{key:12s} {med[key]:8.3f} ({min(v):.3f}-{max(v):.3f})  torch/this {med['torch'] / med[key]:.3f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", nargs="*", help="CxKxHW, e.g. 256x256x56 (default: vgg16's and resnet's layers)")
    ap.add_argument("--targets", nargs="*", type=int, default=[winograd_cl.WGRAD_TILE_TARGET])
    ap.add_argument("--sweep", action="store_true", help="time the Winograd products alone under tiles and chunks")
    ap.add_argument("--seconds", type=float, default=150.0, help="--sweep: stop starting new products after this")
    ap.add_argument("--step", default="", help="comma-separated models: time training steps instead")
    ap.add_argument("--below", nargs="*", type=int, default=[], help="--step: variants keeping layers under N tiles")
    ap.add_argument("--rounds", type=int, default=7, help="--step: turns of each variant")
    ap.add_argument("--iters", type=int, default=10, help="--step: steps per turn")
    args = ap.parse_args()
    if args.step:
        _steps(args.step.split(","), args.batch, args.device, args.below, args.rounds, args.iters)
        return
    layers = [tuple(int(v) for v in s.split("x")) for s in args.layers] if args.layers else LAYERS
    if args.sweep:
        _sweep(args.device, layers, args.batch, args.reps, args.seconds)
        return
    print(f"batch {args.batch}, median of {args.reps} event times per kernel (ms)")
    print("| C | K | HxW | direct | tile target | Winograd | direct / Winograd | Winograd kernels | max diff / max |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c, k, hw in layers:
        ref, off = _wgrad(args.device, c, k, hw, args.batch, "off", args.reps)
        t_off = sum(v[0] for v in off.values())
        for target in args.targets:
            winograd_cl.WGRAD_TILE_TARGET = target
            got, on = _wgrad(args.device, c, k, hw, args.batch, "2", args.reps)
            t_on = sum(v[0] for v in on.values())
            kinds = ", ".join(f"{n} {v[0] * 1e3:.3f}" + (f" ({v[1]})" if v[1] > 1 else "") for n, v in on.items())
            diff = float(np.abs(got - ref).max() / np.abs(ref).max())
            print(
                f"| {c} | {k} | {hw}x{hw} | {t_off * 1e3:.3f} | {target} | {t_on * 1e3:.3f} | {t_off / t_on:.2f}x |"
                f" {kinds} | {diff:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
