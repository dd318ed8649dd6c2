"""Time the GEMMs of one training step (forward, input and weight gradients, as the OpenCL scheduler plans them)
under the tile heuristic and under each tensor-core candidate, so the heuristic for training products can follow
measurements. Split-K weight gradients (a batch of K chunks) are also timed with twice and four times the chunks.

    tools/gpu-run.sh python3 benchmarks/sweep_train_gemms.py --models resnet18 --batch 64 --top 12

Each line: the product (batch x M x N x K, its strides), how often the step runs it, then milliseconds and TFLOP/s
per configuration, the heuristic's first.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import Counter
from typing import Any

import numpy as np


def _specs(name: str, batch: int, device: str) -> Counter[Any]:
    """The GEMM specs of `name`'s training step (loss and every parameter gradient) as a plan on `device` would
    schedule them, with how often each occurs."""
    import torch

    import plait
    from plait.bench.models import get
    from plait.graph import autodiff
    from plait.runtime import get_device
    from plait.schedule.scheduler import schedule

    spec = get(name)
    torch.manual_seed(0)
    ref = spec.torch_factory()
    model = spec.plait_factory(device)
    model.load_state_dict({k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()})
    model.train()
    x_np, y_np = spec.inputs(batch)
    x = plait.Tensor.from_numpy(x_np, device=device)
    y = plait.Tensor.from_numpy(y_np, device=device)
    loss = plait.nn.CrossEntropyLoss()(model(x), y)
    params = [p for p in model.parameters() if p.requires_grad]
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    grads = autodiff.gradients(loss.node, seed, [p.node for p in params])
    r = get_device(device).renderer
    items = schedule(
        [loss.node, *grads.values()],
        r.__dict__.get("split_parts", 256),
        implicit_conv=getattr(r, "implicit_conv", False),
        conv_span=getattr(r, "conv_span", False),
        split_k=getattr(r, "split_k", False),
        winograd_cl=True,
    )
    return Counter(it.gemm for it in items if it.kind == "gemm" and it.gemm is not None)


def _extent(off: int, strides: list[tuple[int, int]]) -> int:
    return off + sum((n - 1) * s for n, s in strides) + 1


def _buffers(dev: Any, spec: Any) -> list[Any]:
    outer = spec.batch // spec.inner
    _, sab, sam, sak = spec.a
    a = _extent(spec.a[0], [(outer, sab), (spec.inner, spec.a_inner), (spec.m, sam), (spec.k, sak)])
    w = spec.conv or spec.conv_t  # B is the image the product gathers from
    if w is not None:
        b = w.n * w.c * w.h * w.w
    else:
        _, sbb, sbk, sbn = spec.b
        b = _extent(spec.b[0], [(outer, sbb), (spec.inner, spec.b_inner), (spec.k, sbk), (spec.n, sbn)])
    sizes = [spec.batch * spec.m * spec.n, a, b]
    bufs = [dev.allocator.alloc(4 * s) for s in sizes]
    rng = np.random.default_rng(0)
    for buf, s in zip(bufs[1:], sizes[1:], strict=True):
        dev.allocator.copy_in(buf, rng.standard_normal(s, dtype=np.float32))
    return bufs


def _time(dev: Any, spec: Any, knobs: dict[str, int], bufs: list[Any], reps: int) -> float:
    from plait.codegen import gemm

    k = gemm.render_opencl(spec, knobs)
    launch = dev.compile(k.source, k.name).bind(bufs, k.global_size, k.local_size)
    launch()
    dev.synchronize()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(5):
            launch()
        dev.synchronize()
        out.append((time.perf_counter() - t0) / 5)
    return sorted(out)[reps // 2]


def _resplit(spec: Any, factor: int) -> Any | None:
    """A split-K product (a batch of `inner` K chunks over one buffer) with `factor` times the chunks, or None."""
    if spec.batch != spec.inner or spec.a_inner == 0 or spec.k % (factor * 32):
        return None
    return dataclasses.replace(
        spec,
        batch=spec.batch * factor,
        inner=spec.inner * factor,
        k=spec.k // factor,
        a_inner=spec.a_inner // factor,
        b_inner=spec.b_inner // factor,
    )


def main() -> None:
    from plait.runtime import get_device
    from plait.tune import GEMM_CANDIDATES, _padded, _tc_heuristic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--top", type=int, default=12, help="products timed per model, by total FLOPs in the step")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget", type=float, default=8.0, help="seconds per product")
    ap.add_argument("--grads", action="store_true", help="only weight gradients (both operands contiguous along K)")
    args = ap.parse_args()
    dev = get_device(args.device)
    from plait.codegen.gemm_tc import mma_tf32_unsupported

    emu = {"MMA": 0} if mma_tf32_unsupported(dev) else {}  # the portable twin where there are no tensor cores
    for name in args.models.split(","):
        specs = _specs(name, args.batch, args.device)
        print(f"== {name} b{args.batch}: {sum(specs.values())} GEMMs, {len(specs)} distinct")
        if args.grads:
            specs = Counter({s: c for s, c in specs.items() if s.a[3] == 1 and s.b[2] == 1 and s.conv is None})
        ranked = sorted(specs.items(), key=lambda kv: -kv[0].flops * kv[1])[: args.top]
        for spec, uses in ranked:
            variants = [("", spec)] + [(f"x{f} chunks ", s) for f in (2, 4) if (s := _resplit(spec, f)) is not None]
            for label, sp in variants:
                heur = _tc_heuristic(sp)
                pool = [heur] + [
                    c
                    for c in GEMM_CANDIDATES["tc"] + GEMM_CANDIDATES["tc_small"]
                    if c != heur and _padded(sp.m, c["BM"]) < 1.5 * sp.m
                ]
                bufs = _buffers(dev, sp)
                start, rows = time.perf_counter(), []
                for knobs in ({**c, **emu} for c in pool):
                    if time.perf_counter() - start > args.budget:
                        break
                    try:
                        t = _time(dev, sp, knobs, bufs, args.reps)
                    except Exception as e:  # a configuration this product cannot take: say so and go on
                        rows.append(f"{knobs} failed: {str(e)[:80]}")
                        continue
                    rows.append(f"{t * 1e3:.3f} ms {sp.flops / t / 1e12:.1f} TF {knobs}")
                for buf in bufs:
                    dev.allocator.free(buf.nbytes, buf.handle)
                conv = " conv" if sp.conv is not None else " conv_t" if sp.conv_t is not None else ""
                print(
                    f"-- {label}{sp.batch}x{sp.m}x{sp.n}x{sp.k} a={sp.a} b={sp.b} inner={sp.inner} "
                    f"a_in={sp.a_inner} b_in={sp.b_inner}{conv}, {uses} uses"
                )
                print("   " + "\n   ".join(rows))


if __name__ == "__main__":
    main()
