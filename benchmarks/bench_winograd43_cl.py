"""3x3 stride-1 convolutions on an OpenCL device, direct (implicit GEMM) against Winograd F(2,3) and F(4,3)
(plait/codegen/winograd_cl.py, a plan's `m` = 2 or 4), layer by layer: a training step's forward and input gradient
(x, w and dy plan inputs, each part compiled alone) and the inference forward at batch 1 (constant weight, bias and
ReLU fused), each profiled kernel by kernel (the device's profiling events, median of --reps), with each result's
max error against PyTorch in float64 relative to the reference's largest magnitude. PLAIT_WINOGRAD_CL=off is the
direct form, =2 F(2,3) wherever it applies, =4 F(4,3).

The default layers are vgg16's 3x3 layers after the first and resnet18/50's stride-1 3x3 ones (CxKxHW, padding 1):

    tools/gpu-run.sh python3 benchmarks/bench_winograd43_cl.py --device opencl:0 --batch 64
    PLAIT_TEST_DEVICES=opencl:0 python3 benchmarks/bench_winograd43_cl.py --batch 2 --reps 1 --layers 16x24x20

`--sweep` instead times each layer's F(4,3) products alone (the 36 batched GEMMs of the training forward and input
gradient as the scheduler lays them out, on random operands): the tile rule's knobs first ("heuristic", which is
`winograd_cl.product_knobs` or the generic tensor-core rule), then every tensor-core candidate of
benchmarks/sweep_step_gemms.py's list:

    tools/gpu-run.sh python3 benchmarks/bench_winograd43_cl.py --sweep --layers 64x64x224,256x256x56 --reps 5
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait import dtypes, settings
from plait.graph import autodiff
from plait.graph.node import Node
from plait.schedule.plan import Plan

sys.path.insert(0, str(Path(__file__).parent))
from bench_winograd5_cl import _kinds, print_tiles, time_tiles

LAYERS = (
    "64x64x224,64x128x112,128x128x112,128x256x56,256x256x56,256x512x28,512x512x28,512x512x14,"
    "64x64x56,128x128x28,256x256x14,512x512x7"
)
MODES = ("off", "2", "4")


def _err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _train_parts(device: str, c: int, k: int, hw: int, batch: int, reps: int) -> list[str]:
    """Rows 'part | off | 2 | 4' of kernel time (ms) and error for the training forward and input gradient."""
    rng = np.random.default_rng(0)
    data = [
        rng.standard_normal((batch, c, hw, hw)).astype(np.float32),
        (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
        rng.standard_normal((batch, k, hw, hw)).astype(np.float32),
    ]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    xt, wt, gt = (torch.tensor(a, dtype=torch.float64, device=dev) for a in data)
    xt.requires_grad_(True)
    out_t = torch.nn.functional.conv2d(xt, wt, padding=1)
    (out_t * gt).sum().backward()
    assert xt.grad is not None
    refs = [out_t.detach().cpu().numpy(), xt.grad.cpu().numpy()]
    del xt, wt, gt, out_t
    cells: dict[str, list[str]] = {"forward": [], "input gradient": []}
    for mode in MODES:
        inputs = [Node("input", (), None, a.shape, dtypes.float32, device) for a in data]
        inputs[0].rg = True
        x, w, g = (plait.Tensor(node) for node in inputs)
        with settings.override(PLAIT_WINOGRAD_CL=mode):
            out = F.conv2d(x, w, padding=1)
            seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
            dx = autodiff.gradients((out * g).sum().node, seed, [x.node])[x.node.uid]
        for row, node, ref in zip(cells.values(), (out.node, dx), refs, strict=True):
            with settings.override(PLAIT_WINOGRAD_CL=mode):
                plan = Plan([node], inputs)
            (got,) = plan(*data)
            total, kinds = _kinds(plan, reps)
            row.append(f"{total * 1e3:.3f} ({_err(got, ref):.1e}; {kinds})")
            del plan, got
    return [f"| {c}->{k} {hw}x{hw} b{batch} | {name} | {' | '.join(row)} |" for name, row in cells.items()]


def _infer(device: str, c: int, k: int, hw: int, batch: int, reps: int) -> str:
    """A row of the inference forward (constant weight and bias, ReLU) under each mode."""
    rng = np.random.default_rng(1)
    xa = rng.standard_normal((batch, c, hw, hw)).astype(np.float32)
    wa = (rng.standard_normal((k, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    ba = rng.standard_normal(k).astype(np.float32)
    ref = torch.relu(
        torch.nn.functional.conv2d(*(torch.tensor(a, dtype=torch.float64) for a in (xa, wa, ba)), padding=1)
    )
    weight, bias = plait.tensor(wa, device=device), plait.tensor(ba, device=device)
    row = []
    for mode in MODES:
        with settings.override(PLAIT_WINOGRAD_CL=mode):
            f = plait.jit(lambda t: F.conv2d(t, weight, bias, padding=1).relu(), device=device)
            plan, _ = f.plan_for([xa])
            got = f(xa)
        total, kinds = _kinds(plan, reps)
        row.append(f"{total * 1e3:.3f} ({_err(got, ref.numpy()):.1e}; {kinds})")
    return f"| {c}->{k} {hw}x{hw} b{batch} | inference forward | {' | '.join(row)} |"


def _products(device: str, c: int, k: int, hw: int, batch: int) -> list[Any]:
    """The distinct F(4,3) product GemmSpecs (batch 36) of the layer's training forward and input gradient."""
    from plait.runtime import get_device
    from plait.schedule.scheduler import schedule

    inputs = [Node("input", (), None, s, dtypes.float32, device) for s in ((batch, c, hw, hw), (k, c, 3, 3))]
    inputs[0].rg = True
    x, w = (plait.Tensor(node) for node in inputs)
    g = plait.Tensor(Node("input", (), None, (batch, k, hw, hw), dtypes.float32, device))
    r = get_device(device).renderer
    with settings.override(PLAIT_WINOGRAD_CL="4"):
        out = F.conv2d(x, w, padding=1)
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
        dx = autodiff.gradients((out * g).sum().node, seed, [x.node])[x.node.uid]
        items = schedule(
            [out.node, dx],
            r.__dict__.get("split_parts", 256),
            implicit_conv=getattr(r, "implicit_conv", False),
            conv_span=getattr(r, "conv_span", False),
            split_k=getattr(r, "split_k", False),
            winograd_cl=True,
        )
    return list(dict.fromkeys(it.gemm for it in items if it.kind == "gemm" and it.gemm and it.gemm.batch == 36))


def _sweep(args: argparse.Namespace) -> None:
    """Time each layer's F(4,3) products under the tile rule's knobs and every candidate (median of --reps)."""
    from plait.runtime import get_device

    dev = get_device(args.device)
    start, seen = time.perf_counter(), set()
    for layer in args.layers.split(","):
        c, k, hw = (int(v) for v in layer.split("x"))
        for sp in _products(args.device, c, k, hw, args.batch):
            if sp in seen:
                continue
            seen.add(sp)
            if time.perf_counter() - start > args.seconds:
                print("-- stopped: --seconds reached", flush=True)
                return
            rows = time_tiles(dev, sp, args.reps)
            print_tiles(f"-- {layer} b{args.batch}: {sp.batch}x{sp.m}x{sp.n}x{sp.k}", sp, rows, 5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--batch", type=int, default=64, help="the training parts' batch")
    ap.add_argument("--infer-batch", type=int, default=1, help="the inference forward's batch (0: none)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--layers", default=LAYERS, help="comma-separated CxKxHW of 3x3 layers (padding 1)")
    ap.add_argument("--seconds", type=float, default=1e9, help="start no new layer after this many seconds")
    ap.add_argument("--sweep", action="store_true", help="time the F(4,3) products alone under each tile candidate")
    args = ap.parse_args()
    if args.sweep:
        _sweep(args)
        return
    start = time.perf_counter()
    print(f"kernel time, median of {args.reps} (ms), (max error / max against float64; kernels by kind)")
    print("| layer | part | direct | F(2,3) | F(4,3) |")
    print("|---|---|---|---|---|")
    for layer in args.layers.split(","):
        if time.perf_counter() - start > args.seconds:
            print(f"-- stopped before {layer}: --seconds reached", flush=True)
            return
        c, k, hw = (int(v) for v in layer.split("x"))
        if args.batch:
            print("\n".join(_train_parts(args.device, c, k, hw, args.batch, args.reps)), flush=True)
        if args.infer_batch:
            print(_infer(args.device, c, k, hw, args.infer_batch, args.reps), flush=True)


if __name__ == "__main__":
    main()
