"""The OpenCL GEMM configurations side by side on one device: every tensor-core (3xTF32) knob set and the FP32
templates, on a large square and on convolution-shaped products, against PyTorch's FP32 matmul (TF32 off) when
CUDA is present; each result's max error relative to a float64 product is printed next to PyTorch FP32's.

    tools/gpu-run.sh python3 benchmarks/bench_gemm_tc.py --device opencl:0 [--shapes 4096x4096x4096 ...]

The first line per shape is the configuration plans pick (tuning cache, else the heuristic).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from plait.codegen import gemm
from plait.codegen.gemm import GemmSpec
from plait.codegen.gemm_tc import mma_tf32_unsupported
from plait.runtime import get_device
from plait.tune import GEMM_CANDIDATES, knobs_for


def _time(fn: Any, sync: Any, reps: int = 5, inner: int = 10) -> float:
    """Median milliseconds of one call, timed over `inner` back-to-back calls per repeat."""
    fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / inner * 1e3)
    return statistics.median(out)


def _shape(text: str) -> tuple[int, int, int, int]:
    parts = [int(x) for x in text.split("x")]
    return (1, *parts) if len(parts) == 3 else (parts[0], parts[1], parts[2], parts[3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--shapes", nargs="+", default=["4096x4096x4096", "64x256x3136x576", "64x512x784x1152"])
    ap.add_argument("--tc-only", action="store_true", help="time only the tensor-core configurations")
    ap.add_argument("--fold", action="store_true", help="also time each tensor-core configuration with FOLD=1")
    ap.add_argument("--small", action="store_true", help="the tensor-core configurations for few output tiles")
    args = ap.parse_args()
    dev = get_device(args.device)
    why = mma_tf32_unsupported(dev)
    print(f"# {dev.name} ({dev.info.name}, {dev.info.driver}); mma.sync tf32: {why or 'works'}")
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    configs = [] if why else list(GEMM_CANDIDATES["tc_small" if args.small else "tc"])
    if args.fold:
        configs += [{**c, "FOLD": 1} for c in configs]
    if not args.tc_only or why:
        configs += GEMM_CANDIDATES["opencl"]
    rng = np.random.default_rng(0)
    for text in args.shapes:
        bsz, m, n, k = _shape(text)
        # B laid out as a convolution's im2col columns: (batch, k, n), A (m, k) shared by every batch
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((bsz, k, n), dtype=np.float32)
        spec = GemmSpec(bsz, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
        flops = 2 * bsz * m * n * k
        ref = None
        line = f"## {bsz}x{m}x{n}x{k}"
        if cuda:
            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            ref = (ta.double() @ tb.double()).cpu().numpy()
            t_ms = _time(lambda ta=ta, tb=tb: ta @ tb, torch.cuda.synchronize)
            err = float(np.abs((ta @ tb).cpu().numpy() - ref).max() / np.abs(ref).max())
            line += f" | torch fp32 {t_ms:.3f} ms {flops / t_ms / 1e9:.1f} TFLOP/s err {err:.2e}"
        else:
            ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
        print(line, flush=True)
        al = dev.allocator
        bufs = [al.alloc(4 * bsz * m * n), al.alloc(a.nbytes), al.alloc(b.nbytes)]
        al.copy_in(bufs[1], a)
        al.copy_in(bufs[2], b)
        for knobs in [knobs_for(dev, "gemm", spec), *configs]:
            kern = gemm.render_opencl(spec, knobs, dev.renderer)
            t0 = time.perf_counter()
            try:
                launch = dev.compile(kern.source, kern.name).bind(bufs, kern.global_size, kern.local_size)
            except Exception as e:
                print(f"{knobs}: build failed: {' '.join(str(e).split())[:300]}")
                continue
            build_s = time.perf_counter() - t0
            t_ms = _time(launch, dev.synchronize)
            got = np.empty((bsz, m, n), np.float32)
            al.copy_out(bufs[0], got)
            err = float(np.abs(got - ref).max() / np.abs(ref).max())
            print(
                f"{kern.name.split('_')[0]:14s} {knobs}: {t_ms:.3f} ms {flops / t_ms / 1e9:.1f} TFLOP/s "
                f"err {err:.2e} (build {build_s:.1f} s)",
                flush=True,
            )
        for buf in bufs:
            al.free(buf.nbytes, buf.handle)


if __name__ == "__main__":
    main()
