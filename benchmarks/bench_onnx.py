"""ONNX benchmark: the five benchmark CNNs exported from PyTorch, run by plait.onnx and by ONNX Runtime (CPU
provider) in the same process on the same data, with the same thread budget: ORT intra_op_num_threads=2 and
plait's cpu device PLAIT_NUM_THREADS=2 (--threads), OMP_WAIT_POLICY=PASSIVE for both.

    .venv/bin/python benchmarks/bench_onnx.py [--models resnet18 ...] [--batches 1 16] [--device cpu] [--twins]

--twins also times plait's own twin of each net (plait.models, the exported torch model's weights loaded) as a
plait.jit plan called on the same host array, so the ONNX path and the twin pay the same copies in and out.
--plans (with --twins) also prints, after the table, where the two plans differ launch by launch (kernel kind,
fused ops, shape, kernel name, which names the tile), with the launch count, the kernels run once at build (work
on constants) and the plan's memory.

Outputs are checked to agree before a time is reported. The contenders run in turn, round by round, so that load
from other jobs on a shared machine falls on all of them alike. Prints a Markdown table (for docs/benchmarks.md);
its last columns are the host's placement of the first two CPUs before and after each row's rounds (benchmarks/
host_pair.py: the round trip of a cache line between them, ~95 ns near and ~440 ns far on the Zen 5 KVM guest), the
multiply-add rate of two threads on them at once relative to one alone (plait.bench.env.cpu_pair_fma: about 0.5 when
the host runs both on one core, which halves any compute-bound two-thread run) and the share of the CPUs' time the
hypervisor took during those rounds (plait.bench.env.steal_share).
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import io
import os
import platform
import time
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("PLAIT_NUM_THREADS", "2")  # read by plait's cpu device when it loads

import numpy as np
import onnxruntime as ort
import torch
from host_pair import describe, pair_ns

import plait
import plait.nn as pnn
from plait.bench.env import cpu_pair_fma, cpu_ticks, steal_share
from plait.bench.timing import summarize
from plait.frontends.native.jit import Jit
from plait.models import architectures, torch_reference
from plait.onnx import InferenceSession
from plait.schedule.plan import Plan
from plait.schedule.profile import item_work

MODELS = ["alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2"]


def reference(name: str) -> torch.nn.Module:
    """The torch model whose weights every column runs (seeded, so each call gives the same weights)."""
    torch.manual_seed(0)
    return torch_reference.build(name).eval()


def twin(name: str, device: str) -> Jit:
    """plait's own model of `name` with `reference(name)`'s weights, as a plait.jit function (plait bench's plan)."""
    model = architectures.builders(pnn)[name]()
    model.load_state_dict({k: v.detach().numpy() for k, v in reference(name).state_dict().items()})
    model.eval()
    return plait.jit(lambda t: model(t), device=device)


def export(name: str) -> bytes:
    net = reference(name)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            net,
            (torch.randn(1, 3, 224, 224),),
            buf,  # type: ignore[arg-type]
            opset_version=17,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "n"}, "y": {0: "n"}},
        )
    return buf.getvalue()


# Every timed call is followed by the same pause before the next contender starts.
# - It must outlast ONNX Runtime's idle workers, which spin for tens of milliseconds after a run (their default,
#   unlike OMP_WAIT_POLICY=PASSIVE for plait and torch): whoever ran next paid for it (resnet18 b1 under load: 116 ms
#   after ORT, 85 ms elsewhere), and under load (6-7 on the 2 cores) 0.2 s was not enough (the twin of mobilenet_v2
#   b1 at 2 threads, medians of 31 rounds: 54.2 ms 0.2 s after ORT, 50.6 ms 1 s after it, 45.3 ms after no ORT).
# - It must be the same after every contender: a call after a longer idle runs slower on a shared host (cores clocked
#   down or caches taken). resnet50 b1, 16 rounds alternating pause lengths (2026-11-24): plait.onnx 59.95 ms after
#   0.2 s and 65.53 after 1 s, ORT 61.90 and 64.35. Until then the pause was 1 s after ORT and 0.2 s after the others,
#   so plait's contenders followed a 1 s pause in half their calls and ORT in none.
SETTLE_S = 1.0


def round_order(names: list[str], r: int) -> list[str]:
    """The order of round `r`: the contenders other than "ort" in a rotation by `r`, then "ort" if it is one. The
    first of a round is the one that follows the previous round's ORT call, so each other contender follows ORT
    equally often (plain rotations of three contenders put the same one after ORT in two rounds of three)."""
    rest = [n for n in names if n != "ort"]
    k = r % len(rest) if rest else 0
    return rest[k:] + rest[:k] + (["ort"] if "ort" in names else [])


def measure_rounds(fns: dict[str, Callable[[], Any]], iters: int, max_seconds: float) -> dict[str, dict[str, Any]]:
    """Time each of `fns` once per round, in the order `round_order` gives, for up to `iters` rounds (at least 3,
    fewer once they pass `max_seconds` of timed calls) after one warm-up each: on a machine that other jobs share, a
    change of load then hits every contender alike. Each call is followed by the same pause (SETTLE_S). Per name,
    plait.bench.timing.measure's statistics (median, quartiles, min, max, samples)."""
    names = list(fns)
    for n in names:
        fns[n]()
        time.sleep(SETTLE_S)
    samples: dict[str, list[float]] = {n: [] for n in names}
    spent = 0.0
    for r in range(iters):
        for n in round_order(names, r):
            t0 = time.perf_counter()
            fns[n]()
            samples[n].append((time.perf_counter() - t0) * 1e3)
            spent += samples[n][-1] / 1e3
            time.sleep(SETTLE_S)
        if spent > max_seconds and r >= 2:
            break
    return {n: summarize(v) for n, v in samples.items()}


def _launches(plan: Plan) -> list[str]:
    """One line per launch: kind, fused ops, GEMM/output shape and the kernel's name without its source hash."""
    out = []
    for item, kernel in zip(plan.launched, plan.kernels, strict=True):
        ops = "+".join(dict.fromkeys(item_work(item)[2]))
        g = item.gemm
        shape = f"b{g.batch} m{g.m} n{g.n} k{g.k}" if g is not None else "x".join(map(str, item.out.shape))
        out.append(f"{item.kind} {ops} {shape} {kernel.name.rsplit('_', 1)[0]}")
    return out


def plan_diff(onnx_plan: Plan | None, twin_plan: Plan) -> str:
    """Where the ONNX path's plan and the twin's differ (a unified diff of `_launches`), after a summary line."""
    if onnx_plan is None:
        return "the ONNX path has no plan (every output known at import)"
    head = " / ".join(
        f"{len(p.kernels)} launches, {sum(bool(i.extra.get('constant')) for i in p.items)} kernels on constants run"
        f" at build, {p.peak_bytes / 1e6:.1f} MB"
        for p in (onnx_plan, twin_plan)
    )
    diff = difflib.unified_diff(_launches(onnx_plan), _launches(twin_plan), "onnx", "twin", lineterm="", n=0)
    return "\n".join([f"ONNX / twin: {head}", *diff])


def _cell(m: dict[str, Any]) -> str:
    return f"{m['median_ms']:.1f} ({m['p25_ms']:.1f}-{m['p75_ms']:.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--twins", action="store_true", help="also time plait's own twin of each net")
    ap.add_argument("--plans", action="store_true", help="with --twins: print where the two plans differ")
    args = ap.parse_args()
    opts = ort.SessionOptions()
    threads = int(os.environ["PLAIT_NUM_THREADS"])
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    print(
        f"date {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, device {args.device},"
        f" {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average"
        f" {' '.join(f'{v:.1f}' for v in os.getloadavg())}, threads {threads} (plait and ORT),"
        f" plait {plait.__version__}, onnxruntime {ort.__version__}, torch {torch.__version__}"
    )
    twin_head = " twin median ms (p25-p75) | ONNX / twin |" if args.twins else ""
    print(
        "| model | batch | plait median ms (p25-p75) | ORT median ms (p25-p75) | plait / ORT | first run (compile) s |"
        + twin_head
        + " CPU pair ns before/after | pair FMA rate before/after | host steal % |"
    )
    print("| --- | --- | --- | --- | --- | --- |" + " --- | --- |" * args.twins + " --- | --- | --- |")
    diffs: list[str] = []  # --plans: printed after the table
    for name in args.models:
        model = export(name)
        ref = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        sess = InferenceSession(model, device=args.device)
        own = twin(name, args.device) if args.twins else None
        for batch in args.batches:
            x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
            feed = {"x": x}
            t0 = datetime.datetime.now()
            got = sess.run(None, feed)[0]
            first = (datetime.datetime.now() - t0).total_seconds()
            want = ref.run(None, feed)[0]
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
            fns = {"plait": partial(sess.run, None, feed), "ort": partial(ref.run, None, feed)}
            if own is not None:
                np.testing.assert_allclose(own(x), want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max()))
                fns["twin"] = partial(own, x)
                if args.plans:
                    diffs.append(f"{name} b{batch}: {plan_diff(sess.plan_for(feed), own.plan_for([x])[0])}")
            before, fma, ticks = pair_ns(), cpu_pair_fma(), cpu_ticks()
            t = measure_rounds(fns, args.iters, args.max_seconds)
            stolen = steal_share(ticks, cpu_ticks())
            fma_text = "/".join("n/a" if v is None else f"{v:.2f}" for v in (fma, cpu_pair_fma()))
            pair = (
                f" {describe(before)}/{describe(pair_ns())} | {fma_text} |"
                f" {'n/a' if stolen is None else f'{100 * stolen:.1f}'} |"
            )
            p, o = t["plait"], t["ort"]
            extra = f" {_cell(t['twin'])} | {p['median_ms'] / t['twin']['median_ms']:.2f} |" if own is not None else ""
            print(
                f"| {name} | {batch} | {_cell(p)} | {_cell(o)} | {p['median_ms'] / o['median_ms']:.2f} | {first:.1f} |"
                + extra
                + pair,
                flush=True,
            )
    print(f"load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print("\n".join(diffs))


if __name__ == "__main__":
    main()
