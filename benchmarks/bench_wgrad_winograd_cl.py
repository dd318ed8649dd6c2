"""Per-layer time of a training convolution's weight gradient on an OpenCL device: the direct product (dy @ columns^T
in K chunks, the columns gathered from the image) against Winograd F(2,3) (`winograd_cl.wgrad_plan`: dy's and x's
tile transforms, 16 batched products in K chunks, the chunks' sum and the output transform), each kernel timed on
its own by the device's profiling events, and the two results compared with each other.

The graph is the weight gradient of sum(conv2d(x, w, padding=1) * g) alone (as `_conv_vjp` builds it in a training
step), compiled with PLAIT_WINOGRAD_CL=off (direct) and =2 (Winograd), run once, then profiled.

    tools/gpu-run.sh python3 benchmarks/bench_wgrad_winograd_cl.py --device opencl:0 --batch 64
    python3 benchmarks/bench_wgrad_winograd_cl.py --device opencl:0 --batch 2 --layers 16x16x8 --targets 1056 2112

`--targets` times Winograd once per value of `winograd_cl.WGRAD_TILE_TARGET` (the 64x64 tiles its K chunks aim for).
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import numpy as np

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen import winograd_cl
from plait.graph import autodiff
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", nargs="*", help="CxKxHW, e.g. 256x256x56 (default: vgg16's and resnet's layers)")
    ap.add_argument("--targets", nargs="*", type=int, default=[winograd_cl.WGRAD_TILE_TARGET])
    args = ap.parse_args()
    layers = [tuple(int(v) for v in s.split("x")) for s in args.layers] if args.layers else LAYERS
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
