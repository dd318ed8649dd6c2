"""Time a model's largest training GEMMs on OpenCL under tile and load variants, built in parallel and timed by
profiling events: weight gradients with half or twice the K chunks, with their output gradient read in place from
NCHW (`a_nchw`) where the scheduler keeps a copy, and in wider tiles; the forward and input-gradient products in
wider tiles and, for implicit convolutions, gathering four columns per load (knob VG). The numbers behind the
rules in plait/tune and plait/schedule/scheduler.py (docs/benchmarks.md). With --ab, each product the heuristic
gives four-column gathers runs with and without them.

    tools/gpu-run.sh python3 benchmarks/sweep_wgrad_cl.py --models vgg16 --batch 64 --top 16

Each line: the product (batch x M x N x K, the variant), how often the step runs it, then milliseconds and
TFLOP/s per configuration (the heuristic's first).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

WIDE = {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64}
VARIANTS = {
    "grad": [
        {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32},
        WIDE,
        {**WIDE, "KS": 2},
        {"V": 3, "BM": 128, "BN": 256, "BK": 8, "WM": 64, "WN": 64},
        {"V": 3, "BM": 256, "BN": 128, "BK": 8, "WM": 64, "WN": 64},
        {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64},
        {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "KS": 2},
    ],
    "other": [
        {**WIDE, "KS": 2},
        {"V": 3, "BM": 128, "BN": 256, "BK": 8, "WM": 64, "WN": 64},
        {"V": 3, "BM": 64, "BN": 256, "BK": 8, "WM": 32, "WN": 64},
        {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2},
        {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64},
        WIDE,
    ],
}


def _rechunk(spec: Any, num: int, den: int) -> Any | None:
    """A split-K weight gradient (a batch of `inner` K chunks) with num/den times the chunks, or None."""
    if spec.batch != spec.inner or spec.a_inner == 0 or spec.batch * num % den or spec.k * den % num:
        return None
    k = spec.k * den // num
    if k % 32:
        return None
    return dataclasses.replace(
        spec,
        batch=spec.batch * num // den,
        inner=spec.inner * num // den,
        k=k,
        a_inner=spec.a_inner * den // num,
        b_inner=spec.b_inner * den // num,
    )


def _in_place(spec: Any) -> Any | None:
    """A weight gradient that reads a (C, N*P) copy of dy, reading dy's NCHW buffer instead (`a_nchw`)."""
    win = spec.conv_t
    if win is None or spec.a_nchw is not None or spec.a[0] or spec.a[1]:
        return None
    plane = win.oh * win.ow
    if spec.a[2] != win.n * plane:  # rows of one image's plane: already a view of the NCHW buffer
        return None
    return dataclasses.replace(spec, a_nchw=(plane, spec.m * plane))


def _variants(spec: Any) -> list[tuple[str, Any]]:
    out = [("", spec)]
    if spec.conv_t is None:
        return out
    if (nchw := _in_place(spec)) is not None:
        out.append(("nchw ", nchw))
    # twice the chunks only where the product has no copy of dy to drop (the wide ones' chunks are at their floor)
    for label, (num, den) in (("x1/2 ", (1, 2)), ("x2 ", (2, 1)))[: 1 if nchw is not None else 2]:
        for name, sp in list(out[: 2 if nchw is not None else 1]):
            if (re := _rechunk(sp, num, den)) is not None:
                out.append((f"{name}{label}", re))
    return out


def _buffers(dev: Any, spec: Any, pool: dict[int, Any]) -> list[Any]:
    """C, A and B buffers for `spec` (B the image a gathering product reads), from `pool` by their float count
    (one product's variants share them), filled with uniform random values when first made."""
    _, sab, sam, sak = spec.a
    outer = spec.batch // spec.inner
    a = spec.a[0] + (outer - 1) * sab + (spec.inner - 1) * spec.a_inner + (spec.m - 1) * sam + (spec.k - 1) * sak + 1
    if spec.a_nchw is not None:  # the NCHW buffer of the (C, N*P) rows the strides describe: the same floats
        a = max(a, spec.m * sam)
    win = spec.conv or spec.conv_t
    if win is not None:
        b = win.n * win.c * win.h * win.w
    else:
        _, sbb, sbk, sbn = spec.b
        b = (
            spec.b[0]
            + (outer - 1) * sbb
            + (spec.inner - 1) * spec.b_inner
            + (spec.k - 1) * sbk
            + (spec.n - 1) * sbn
            + 1
        )
    out = []
    for i, size in enumerate((spec.batch * spec.m * spec.n, a, b)):
        key = size * 4 + i
        if key not in pool:
            pool[key] = dev.allocator.alloc(4 * size)
            if i:
                dev.allocator.copy_in(pool[key], np.random.default_rng(i).random(size, dtype=np.float32))
        out.append(pool[key])
    return out


def _before(spec: Any, heur: dict[str, int]) -> list[tuple[str, Any, dict[str, int]]]:
    """With --ab: the product with the knobs the heuristic gave before the four-column gathers, where they differ."""
    from plait.tune import _four_columns

    if not _four_columns(spec):
        return []
    return [("before ", spec, {k: v for k, v in heur.items() if k not in ("VG", "KS")})]


def main() -> None:
    from sweep_train_gemms import _specs

    from plait.codegen import gemm
    from plait.codegen.gemm_tc import local_bytes, mma_tf32_unsupported
    from plait.runtime import get_device
    from plait.tune import _padded, _tc_heuristic

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vgg16")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--top", type=int, default=16, help="products timed per model, by total FLOPs in the step")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=200.0, help="stop starting new products after this long")
    ap.add_argument("--ab", action="store_true", help="products with four-column gathers against without them")
    args = ap.parse_args()
    dev = get_device(args.device)
    emu = {"MMA": 0} if mma_tf32_unsupported(dev) else {}
    have = dev.info.extra.get("local_mem", 48 * 1024)
    start = time.perf_counter()
    pool_bufs: dict[int, Any] = {}
    for name in args.models.split(","):
        specs = _specs(name, args.batch, args.device)
        ranked = sorted(specs.items(), key=lambda kv: -kv[0].flops * kv[1])[: args.top]
        for spec, uses in ranked:
            if time.perf_counter() - start > args.seconds:
                print("-- stopped: --seconds reached")
                return
            for buf in pool_bufs.values():
                dev.allocator.free(buf.nbytes, buf.handle)
            pool_bufs.clear()
            if args.ab:
                heur = _tc_heuristic(spec)
                before = _before(spec, heur)
                if not before:
                    continue
                runs = [("now ", spec, heur), *before]
                kernels = [gemm.render_opencl(sp, {**kn, **emu}) for _, sp, kn in runs]
                progs = dev.compile_batch([(k.source, k.name) for k in kernels])
                rows = []
                for (label, sp, kn), kern, prog in zip(runs, kernels, progs, strict=True):
                    launch = prog.bind(_buffers(dev, sp, pool_bufs), kern.global_size, kern.local_size)
                    t = sorted(dev.time_launch(launch) for _ in range(args.reps))[args.reps // 2]
                    rows.append(f"{label}{t * 1e3:.3f} ms {sp.flops / t / 1e12:.1f} TF {kn}")
                print(
                    f"-- {name} {spec.batch}x{spec.m}x{spec.n}x{spec.k} a_nchw={spec.a_nchw}, {uses} uses", flush=True
                )
                print("   " + "\n   ".join(rows), flush=True)
                continue
            for label, sp in _variants(spec):
                pool = VARIANTS["grad" if sp.conv_t is not None else "other"]
                heur = _tc_heuristic(sp)
                if sp.conv is not None:  # an implicit convolution: its tiles gathering four columns per load
                    pool = [{**heur, "VG": 1}, *({**c, "VG": 1} for c in pool)]
                knobs = [heur] + [c for c in pool if c != heur and _padded(sp.m, c["BM"]) < 1.5 * sp.m]
                knobs = [{**c, **emu} for c in knobs if local_bytes(c) <= have]
                kernels = [gemm.render_opencl(sp, kn) for kn in knobs]
                progs = dev.compile_batch([(k.source, k.name) for k in kernels])
                bufs = _buffers(dev, sp, pool_bufs)
                rows = []
                for kn, kern, prog in zip(knobs, kernels, progs, strict=True):
                    launch = prog.bind(bufs, kern.global_size, kern.local_size)
                    t = sorted(dev.time_launch(launch) for _ in range(args.reps))[args.reps // 2]
                    rows.append(f"{t * 1e3:.3f} ms {sp.flops / t / 1e12:.1f} TF {kn}")
                kind = " conv" if sp.conv is not None else " conv_t" if sp.conv_t is not None else ""
                print(f"-- {label}{sp.batch}x{sp.m}x{sp.n}x{sp.k}{kind} a_nchw={sp.a_nchw}, {uses} uses", flush=True)
                print("   " + "\n   ".join(rows), flush=True)


if __name__ == "__main__":
    main()
