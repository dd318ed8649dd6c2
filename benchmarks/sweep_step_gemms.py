"""Time every GEMM of a model's training step on OpenCL under the heuristic's tiles and the whole tensor-core
candidate list, with K split differently: the products the scheduler splits with half, twice and four times
the chunks, and the unsplit few-row ones (a linear layer's input gradient) split in 2, 4 and 8. Kernels are built
in parallel and timed by profiling events, so a whole small net (alexnet b64) fits one device call. The numbers
behind the alexnet rules in plait/tune and plait/schedule/scheduler.py (docs/benchmarks.md). A split's partial
sums cost one more small reduction launch, not included.

    tools/gpu-run.sh python3 benchmarks/sweep_step_gemms.py --models alexnet --batch 64

Each product: its shape (batch x M x N x K, the variant), how often the step runs it, then the heuristic's time
and the five fastest configurations (ms, TFLOP/s, knobs).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def _split(spec: Any, parts: int) -> Any | None:
    """An unsplit product (no convolution gather) as `parts` K chunks over the same buffers, or None."""
    if spec.batch != 1 or spec.conv is not None or spec.conv_t is not None or spec.k % (parts * 32):
        return None
    kc = spec.k // parts
    return dataclasses.replace(spec, batch=parts, inner=parts, k=kc, a_inner=kc * spec.a[3], b_inner=kc * spec.b[2])


def _variants(spec: Any) -> list[tuple[str, Any]]:
    from sweep_wgrad_cl import _rechunk

    out = [("", spec)]
    if spec.batch == spec.inner and spec.a_inner and spec.batch > 1:
        for label, (num, den) in (("x1/2 ", (1, 2)), ("x2 ", (2, 1)), ("x4 ", (4, 1))):
            if (re := _rechunk(spec, num, den)) is not None:
                out.append((f"{label}chunks ", re))
    elif spec.m <= 64:
        out += [(f"split {p} ", s) for p in (2, 4, 8) if (s := _split(spec, p)) is not None]
    return out


def _knobs(spec: Any, have: int) -> list[dict[str, int]]:
    """The heuristic's knobs first, then every tensor-core candidate that pads the rows by under half, each also
    with two k8 steps per add (KS 2) where the tile allows and with the batch folded into the columns where A is
    shared."""
    from plait.codegen.gemm_tc import local_bytes
    from plait.tune import GEMM_CANDIDATES, _padded, _tc_heuristic

    heur = _tc_heuristic(spec)
    pool = [c for c in GEMM_CANDIDATES["tc"] + GEMM_CANDIDATES["tc_small"] if _padded(spec.m, c["BM"]) < 1.5 * spec.m]
    pool += [{**c, "KS": 2} for c in pool if "KS" not in c and c["BK"] % (16 * c.get("WK", 1)) == 0]
    if spec.batch > 1 and spec.a[1] == 0 and spec.a_inner == 0:
        pool += [{**c, "FOLD": 1} for c in pool if "FOLD" not in c]
    out = [heur]
    for c in pool:
        if c not in out and local_bytes(c) <= have:
            out.append(c)
    return out


def main() -> None:
    from sweep_train_gemms import _specs
    from sweep_wgrad_cl import _buffers

    from plait.codegen import gemm
    from plait.codegen.gemm_tc import mma_tf32_unsupported
    from plait.runtime import get_device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="alexnet")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--top", type=int, default=30, help="products timed per model, by total FLOPs in the step")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=200.0, help="stop starting new products after this long")
    args = ap.parse_args()
    dev = get_device(args.device)
    emu = {"MMA": 0} if mma_tf32_unsupported(dev) else {}
    have = dev.info.extra.get("local_mem", 48 * 1024)
    start = time.perf_counter()
    for name in args.models.split(","):
        specs = _specs(name, args.batch, args.device)
        ranked = sorted(specs.items(), key=lambda kv: -kv[0].flops * kv[1])[: args.top]
        for spec, uses in ranked:
            for label, sp in _variants(spec):
                if time.perf_counter() - start > args.seconds:
                    print("-- stopped: --seconds reached", flush=True)
                    return
                pool: dict[int, Any] = {}
                knobs = [{**c, **emu} for c in _knobs(sp, have)]
                kernels, good = [], []
                for kn in knobs:
                    try:
                        kernels.append(gemm.render_opencl(sp, kn))
                        good.append(kn)
                    except Exception as e:  # a tile this product cannot take: say so and go on
                        print(f"   render {kn}: {str(e)[:80]}")
                progs = dev.compile_batch([(k.source, k.name) for k in kernels])
                bufs = _buffers(dev, sp, pool)
                rows = []
                for kn, kern, prog in zip(good, kernels, progs, strict=True):
                    launch = prog.bind(bufs, kern.global_size, kern.local_size)
                    t = sorted(dev.time_launch(launch) for _ in range(args.reps))[args.reps // 2]
                    rows.append((t, kn))
                for buf in pool.values():
                    dev.allocator.free(buf.nbytes, buf.handle)
                kind = " conv" if sp.conv is not None else " conv_t" if sp.conv_t is not None else ""
                print(
                    f"-- {name} {label}{sp.batch}x{sp.m}x{sp.n}x{sp.k}{kind} a={sp.a} b={sp.b} inner={sp.inner}, "
                    f"{uses} uses",
                    flush=True,
                )
                heur_t = rows[0][0]
                best = sorted(rows, key=lambda r: r[0])[:5]
                lines = [f"heuristic {heur_t * 1e3:.3f} ms {sp.flops / heur_t / 1e12:.1f} TF {rows[0][1]}"]
                lines += [f"{t * 1e3:.3f} ms {sp.flops / t / 1e12:.1f} TF {kn}" for t, kn in best]
                print("   " + "\n   ".join(lines), flush=True)


if __name__ == "__main__":
    main()
