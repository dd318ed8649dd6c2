"""A/B of cpu kernel constants at two threads, split by where the host has placed the guest's two vCPUs: "near"
(they share an L3: a cache line's round trip between CPU 0 and CPU 1 takes ~100 ns) or "far" (separate L3s, another
CCD: ~450 ns). The placement switches every few seconds to minutes on the Zen 5 KVM guest, so one process builds
the benchmark CNN's plan twice or more (A: the constants given, B: another set, by default as they are; --more: C,
D, ...), runs a window of stamped team replays of each plan in turn, measures the round trip before and after each
round of windows and files the round under near or far when both agree. Per mode: the replay medians of each plan
against A's, and per kernel kind the summed step spans (bench_team_steps.py's numbers), most changed first.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python \\
        benchmarks/bench_far_ab.py resnet50 --a KSPLIT=0 --windows 40

--probe only prints the round trip and the cross-core line costs (bench_far_ab's C probe) for --seconds, to see
which placement the guest is in and what a line written by the other vCPU costs to read and to write again.
"""

from __future__ import annotations

import argparse
import ast
import collections
import ctypes
import importlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, twin
from bench_team_steps import per_step, steal_ticks
from bench_team_steps_pause import replays

from plait.bench.env import cpu_pair_ns
from plait.codegen import gemm_c
from plait.runtime.cpu_team import TeamRun

# What a 1 MB buffer costs per 64-byte line on CPU 0 (line_cost: reading it after CPU 1 wrote it or after CPU 0 did;
# writing it again after CPU 1 read a copy or after nobody else did). The round trip between the two CPUs is
# plait.bench.env.cpu_pair_ns.
PROBE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); sched_setaffinity(0, sizeof s, &s); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static float* buf; static long nf; static pthread_barrier_t bar; static volatile float sink; static int mode;
static double took;
static void wr(float v) { for (long i = 0; i < nf; i++) buf[i] = v + (float)i; }
static void rd(void) { float s = 0; for (long i = 0; i < nf; i += 16) s += buf[i]; sink = s; }
static void* side(void* arg) {
  int me = (int)(long)arg; pin(me);
  for (int rep = 0; rep < 5; rep++) {
    /* mode 0: 1 writes, 0 reads; 1: 0 writes, 0 reads; 2: 1 reads a copy, 0 writes; 3: 0 writes twice */
    if (me == (mode == 0 ? 1 : 0) && mode != 2) wr((float)rep);
    if (me == 1 && mode == 2) rd();
    pthread_barrier_wait(&bar);
    double t = now();
    if (me == 0) { if (mode < 2) rd(); else wr((float)rep + 1); }
    if (me == 0) took = now() - t;
    pthread_barrier_wait(&bar);
  }
  return 0;
}
double line_cost(int m) {
  mode = m; nf = 1 << 18;
  if (!buf) { buf = aligned_alloc(64, nf * 4); memset(buf, 0, nf * 4); }
  pthread_barrier_init(&bar, 0, 2);
  pthread_t a, b; pthread_create(&a, 0, side, (void*)0L); pthread_create(&b, 0, side, (void*)1L);
  pthread_join(a, 0); pthread_join(b, 0); pthread_barrier_destroy(&bar);
  return took / (nf / 16) * 1e9;
}
"""

MODULES = ("gemm_c", "winograd_c", "pointwise_c", "stem_pool_c", "conv_s2_c", "irblock_c")


def probe_lib() -> Any:
    """The probe above, compiled once into a temporary folder at -O2 (the cpu device's -O3 -march=native would
    vectorise the line loops, and the costs docs/benchmarks.md quotes are per scalar access)."""
    folder = Path(tempfile.mkdtemp())
    (folder / "probe.c").write_text(PROBE)
    subprocess.run(
        ["gcc", "-O2", "-pthread", "-shared", "-fPIC", "-o", str(folder / "probe.so"), str(folder / "probe.c")],
        check=True,
    )
    lib = ctypes.CDLL(str(folder / "probe.so"))
    lib.line_cost.restype = ctypes.c_double
    return lib


def round_trip() -> float:
    """ns of a cache line's round trip between the first two CPUs (plait.bench.env.cpu_pair_ns)."""
    return cpu_pair_ns() or float("nan")


def parse(text: str) -> dict[str, Any]:
    """'KSPLIT=0,winograd_c.NAME=(1, 2)' -> {(module, name): value} (gemm_c's constant unless a module is named)."""
    out: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        mod, _, attr = name.rpartition(".")
        module = importlib.import_module(f"plait.codegen.{mod or 'gemm_c'}")
        if (mod and mod not in MODULES) or not hasattr(module, attr):
            raise SystemExit(f"no {name}")
        out[(module, attr)] = ast.literal_eval(value)
    return out


def build(model: str, x: np.ndarray, patches: dict[str, Any]) -> tuple[Any, TeamRun, np.ndarray]:
    """(plan, its one team run, output) of the twin rendered with the constants patched."""
    saved = {key: getattr(*key) for key in patches}
    for key, value in patches.items():
        setattr(*key, value)
    common = gemm_c.COMMON
    gemm_c.COMMON = gemm_c.common()  # the packing library's constants are substituted at import
    try:
        f = twin(model, "cpu")
        y = np.asarray(f(x))
        plan = f.plan_for([x])[0]
    finally:
        for key, value in saved.items():
            setattr(*key, value)
        gemm_c.COMMON = common
    runs = [r for r in plan.replay if isinstance(r, TeamRun)]
    if len(runs) != 1:
        raise SystemExit(f"{model}: expected one team run")
    return plan, runs[0], y


def probe(seconds: float) -> None:
    """Round trips and line costs every half second for `seconds`."""
    lib = probe_lib()
    end = time.time() + seconds
    while time.time() < end:
        r0 = round_trip()
        costs = [lib.line_cost(m) for m in range(4)]
        r1 = round_trip()
        print(
            f"round trip {r0:5.0f}/{r1:5.0f} ns; per line: read after the other wrote {costs[0]:.2f}, after self "
            f"{costs[1]:.2f}; write after the other read {costs[2]:.2f}, after self {costs[3]:.2f} ns",
            flush=True,
        )
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", choices=MODELS, default="resnet50")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--a", default="", help="plan A's constants: NAME=literal (gemm_c's) or MODULE.NAME=literal")
    ap.add_argument("--b", default="", help="plan B's constants (default: as they are)")
    ap.add_argument("--more", nargs="*", default=[], help="plans C, D, ...: more sets of constants, each against A")
    ap.add_argument("--windows", type=int, default=40, help="window pairs (one window of A, one of B)")
    ap.add_argument("--replays", type=int, default=15, help="stamped replays per window")
    ap.add_argument("--near", type=float, default=250.0, help="a pair is near when both round trips are below (ns)")
    ap.add_argument("--far", type=float, default=380.0, help="a pair is far when both round trips are above (ns)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--probe", action="store_true", help="only print round trips and line costs")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    if args.probe:
        probe(args.seconds)
        return
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    variants = [args.a, args.b, *args.more]
    names = [chr(ord("A") + i) for i in range(len(variants))]
    builds = [build(args.model, x, parse(v)) for v in variants]
    diff = max(float(np.abs(b[2] - builds[0][2]).max()) for b in builds)
    # each plan's kernel kinds: plans whose constants change kernel choices (a Winograd layer instead of a GEMM) are
    # compared kind by kind over the union of their kinds
    kinds = [[k.name.rsplit("_", 1)[0] for k in b[0].kernels] for b in builds]
    load0, steal0, t0 = os.getloadavg()[0], steal_ticks(), time.time()
    got: dict[str, list[list[tuple[dict[str, np.ndarray], list[float]]]]] = {
        mode: [[] for _ in variants] for mode in ("near", "far")
    }
    other = 0
    for w in range(args.windows):
        r0 = round_trip()
        res = {}
        for i in range(len(variants)):  # each plan first in turn
            v = (w + i) % len(variants)
            plan, run, _ = builds[v]
            st, walls = replays(plan.device, run, args.replays, 0.0)
            res[v] = (per_step(st), walls)
        r1 = round_trip()
        mode = "near" if max(r0, r1) < args.near else "far" if min(r0, r1) > args.far else ""
        print(
            f"window {w:3d}: round trip {r0:5.0f}/{r1:5.0f} ns {mode:4s}  replay median "
            + " ".join(f"{names[v]} {np.median(res[v][1]):6.2f}" for v in range(len(variants)))
            + " ms",
            flush=True,
        )
        if mode:
            for v in range(len(variants)):
                got[mode][v].append(res[v])
        else:
            other += 1
    secs = time.time() - t0
    print(
        f"{args.model} b{args.batch}: "
        + ", ".join(f"{names[v]} = {variants[v] or 'as they are'}" for v in range(len(variants)))
        + "; outputs differ by "
        f"{diff:.2e}; load {load0:.2f} -> {os.getloadavg()[0]:.2f}, steal {steal_ticks() - steal0} ticks in "
        f"{secs:.0f} s; {other} windows unclassified"
    )
    for mode, per in got.items():
        if not per[0]:
            print(f"{mode}: no windows")
            continue
        wa = per[0]
        ma = np.array([float(np.median(w)) for _, w in wa])
        span_a = np.mean([s["span"] for s, _ in wa], axis=0)
        print(
            f"{mode} ({len(wa)} windows each): A replay median {np.median(np.concatenate([w for _, w in wa])):.2f} ms"
        )
        for v in range(1, len(variants)):
            wb = per[v]
            ratio = np.array([float(np.median(w)) for _, w in wb]) / ma
            span_b = np.mean([s["span"] for s, _ in wb], axis=0)
            print(
                f"  {names[v]}: replay median {np.median(np.concatenate([w for _, w in wb])):.2f} ms (pooled), per "
                f"window {names[v]}/A median {np.median(ratio):.3f} ({names[v]} faster in {int((ratio < 1).sum())} of "
                f"{len(ratio)}); step spans summed A {span_a.sum():.2f} {names[v]} {span_b.sum():.2f} ms"
            )
            agg: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
            for i, k in enumerate(kinds[0]):
                agg[k][0] += float(span_a[i])
                agg[k][2] += 1
            for i, k in enumerate(kinds[v]):
                agg[k][1] += float(span_b[i])
                agg[k][3] += 1
            for k, (a, b, n, nb) in sorted(agg.items(), key=lambda kv: -abs(kv[1][1] - kv[1][0]))[: args.top]:
                count = f"x{int(n):2d}" if n == nb else f"x{int(n)}/{int(nb)}"
                print(f"    {k:34s} {count:5s}  A {a:6.3f}  {names[v]} {b:6.3f}  {names[v]}-A {b - a:+6.3f} ms")


if __name__ == "__main__":
    main()
