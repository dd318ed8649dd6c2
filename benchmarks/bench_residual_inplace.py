"""What the cpu GEMM's residual epilogue costs on one 1x1 convolution, against the in-place form ONNX Runtime uses.

A layer `relu(conv1x1(x) + bias + r)` is built three ways, each a one-kernel plan, and the plans are timed
interleaved (order reversed every round; one thread: fewest and median thread CPU ms, more: wall ms):
- `epilogue`: plait's kernel as it is: C = A @ B, then per row block the epilogue adds bias and the residual r.
- `inplace`: timing only (its output is not checked): the kernel runs with C as its accumulator (every micro-kernel
  call adds to C, `add` 1) and an epilogue of bias and ReLU. That is the memory traffic of C holding r on entry, which
  is what ONNX Runtime does (its fused Conv+Sum writes over the Sum input): each line of C is read once and written
  once, instead of C's lines fetched for writing and r's read besides.
- `none`: no residual at all (bias and ReLU), the floor.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_residual_inplace.py --batch 16 --cin 64 --hw 56 --cout 256
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait.bench.env import cpu_ticks, steal_text
from plait.codegen import gemm_c
from plait.schedule.plan import Plan

ORIGINAL_DRIVER: Callable[[int, int], str] = gemm_c._driver
# the two micro-kernel calls of the driver (merged images, one image) whose `add` argument is `pc > 0`
ADD_CALLS = (
    "plait_tile_{t}(kc, at, lda, panel, C, m, n, ii, jj, mr, nr, acc || pc > 0, last, epi, extra, sc);",
    "plait_micro_{t}(kc, at, lda, panel, c + ii * rs + jj * cs, rs, cs, mr, nr, acc || pc > 0);",
)


def accumulating_driver(mr: int, nv: int) -> str:
    """gemm_c's driver for an mr x nv tile with every micro-kernel call adding to C."""
    src = ORIGINAL_DRIVER(mr, nv)
    for call in ADD_CALLS:
        call = call.replace("{t}", f"{mr}x{nv}")
        if call not in src:
            raise SystemExit(f"the driver no longer has the call {call!r}: update ADD_CALLS")
        src = src.replace(call, call.replace("pc > 0", "1"))
    return src


def build(form: str, x: np.ndarray, w: np.ndarray, b: np.ndarray, r: np.ndarray) -> Plan:
    """The one-kernel plan of the layer in `form`; `epilogue` and `none` are checked against PyTorch."""
    wp, bp, rp = (plait.tensor(a, device="cpu") for a in (w, b, r))
    if form == "epilogue":
        f = plait.jit(lambda t: (F.conv2d(t, wp, bp) + rp).relu(), device="cpu")
    else:
        f = plait.jit(lambda t: F.conv2d(t, wp, bp).relu(), device="cpu")
    if form == "inplace":
        gemm_c._driver = accumulating_driver
    try:
        y = np.asarray(f(x))
        plan = f.plan_for([x])[0]
    finally:
        gemm_c._driver = ORIGINAL_DRIVER
    if len(plan.kernels) != 1:
        raise SystemExit(f"{form}: expected one kernel, got {[k.name for k in plan.kernels]}")
    if form != "inplace":
        want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b))
        want = want + torch.from_numpy(r) if form == "epilogue" else want
        np.testing.assert_allclose(y, want.relu().numpy(), rtol=1e-4, atol=1e-4)
    return plan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--cin", type=int, default=64)
    ap.add_argument("--hw", type=int, default=56, help="height and width of the plane")
    ap.add_argument("--cout", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.batch, args.cin, args.hw, args.hw)).astype(np.float32)
    w = (rng.standard_normal((args.cout, args.cin, 1, 1)) * 0.1).astype(np.float32)
    b = rng.standard_normal(args.cout).astype(np.float32)
    r = rng.standard_normal((args.batch, args.cout, args.hw, args.hw)).astype(np.float32)
    forms = ["epilogue", "inplace", "none"]
    plans = {f: build(f, x, w, b, r) for f in forms}
    threads = int(os.environ["OMP_NUM_THREADS"])
    clock = time.thread_time if threads == 1 else time.perf_counter
    times: dict[str, list[float]] = {f: [] for f in forms}
    ticks = cpu_ticks()
    for k in range(args.rounds):
        for f in forms if k % 2 == 0 else forms[::-1]:
            t0 = clock()
            plans[f].run()
            times[f].append(clock() - t0)
    steal = steal_text(ticks, cpu_ticks())
    print(f"{plans['epilogue'].kernels[0].name}, {threads} thread(s), {args.rounds} rounds")
    base = np.array(times["epilogue"])
    for f in forms:
        t = np.array(times[f])
        print(
            f"  {f:8s} fewest {t.min() * 1e3:8.3f} ms  median {np.median(t) * 1e3:8.3f} ms  "
            f"fewest / epilogue's {t.min() / base.min():.3f}  median per round {np.median(t / base):.3f}"
        )
    print(f"load average {os.getloadavg()[0]:.2f}, steal {steal} of the cores")


if __name__ == "__main__":
    main()
