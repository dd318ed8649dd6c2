"""alexnet's classifier at batch 64 on OpenCL (9216 -> 4096 -> 4096 -> 1000, ReLU), with split-K into more or fewer
parts and different tensor-core tiles: which split makes these weight-streaming products (64 rows, 151 MB of fc6
weights read once) fastest. Each configuration is a fresh plan; its kernels are timed by the per-kernel report
(profiling events, median of --reps) and its outputs checked against NumPy.

    python benchmarks/bench_split_k_cl.py --device opencl:0
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

TILES: dict[str, dict[str, int] | None] = {
    "heuristic": None,
    "64x32k32wk2": {"V": 3, "BM": 64, "BN": 32, "BK": 32, "WM": 32, "WN": 16, "WK": 2},
    "64x64k32": {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32},
    "64x64k16wk2": {"V": 3, "BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "WK": 2},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="opencl:0")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--targets", default="264,528,1056,2112", help="scheduler.SPLIT_K_TARGET values to try")
    p.add_argument("--tiles", default=",".join(TILES))
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args()

    import plait
    import plait.tune
    from plait import nn
    from plait.schedule import profile, scheduler

    rng = np.random.default_rng(0)
    layers = [nn.Linear(9216, 4096, device=args.device), nn.Linear(4096, 4096, device=args.device)]
    layers.append(nn.Linear(4096, 1000, device=args.device))
    x = rng.standard_normal((args.batch, 9216), dtype=np.float32)
    host = [(lay.weight.numpy().astype(np.float64), lay.bias.numpy().astype(np.float64)) for lay in layers]
    want = x.astype(np.float64)
    for i, (w, b) in enumerate(host):
        want = want @ w.T + b
        want = np.maximum(want, 0) if i < 2 else want
    base_knobs = plait.tune.knobs_for

    def net(t: Any) -> Any:
        return layers[2](layers[1](layers[0](t).relu()).relu())

    print(
        "| split target | tiles | fc GEMM ms (per layer) | split sums ms | all kernels ms | replay ms | max rel err |"
    )
    print("|---|---|---|---|---|---|---|")
    for target in (int(t) for t in args.targets.split(",")):
        for tile in args.tiles.split(","):
            knobs = TILES[tile]

            def pinned(device: Any, kind: str, spec: Any, knobs: dict[str, int] | None = knobs) -> dict[str, int]:
                if knobs is not None and kind == "gemm" and spec.conv is None and spec.m == args.batch:
                    return dict(knobs)
                return base_knobs(device, kind, spec)

            plait.tune.knobs_for = pinned  # type: ignore[assignment]  # this process only: the tiles under test
            scheduler.SPLIT_K_TARGET = target
            f = plait.jit(net, device=args.device)
            got = f(x).astype(np.float64)
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            plan, _ = f.plan_for([x])
            rep = profile.profile_plan(plan, reps=args.reps)
            gemms = [k for k in sorted(rep.kernels, key=lambda k: k.index) if k.kind == "gemm"]
            sums = sum(k.time_s for k in rep.kernels if k.kind != "gemm")
            per = " + ".join(f"{k.time_s * 1e3:.3f} ({k.shape})" for k in gemms)
            print(
                f"| {target} | {tile} | {per} | {sums * 1e3:.3f} | {rep.total_s * 1e3:.3f} | "
                f"{rep.replay_s * 1e3:.3f} | {err:.1e} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
