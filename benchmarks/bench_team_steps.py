"""Each kernel's time inside a cpu plan's team replay, per thread: a copy of the team runner (plait/runtime/
cpu_team.py) that stamps, for every step and thread, the wall clock before the step's barrier, after it and after the
kernel, and the thread's CPU clock around the kernel. It says per kernel how long the slowest thread worked (the
step's critical path), how long the other one waited at the next barrier (imbalance), and the threads' CPU time
summed against the same replay on one thread (work inflation: what the two cores' shared caches cost). --ort runs
ONNX Runtime's export of the same net at one and two intra-op threads in the same rounds (its wall time and the sum
of its profiler's node times), so plait's scaling and ORT's come from the same minutes.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 PLAIT_NUM_THREADS=2 .venv/bin/python \
        benchmarks/bench_team_steps.py resnet50 --batch 1 --replays 30 --fifo --top 25
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin
from bench_ort_nodes import node_kind
from bench_source_ab import patched_compilers
from bench_team_barrier import scheduling

from plait.bench.env import cpu_pair_fma, cpu_ticks
from plait.codegen.c import TEAM_SYNC
from plait.runtime.cpu_team import TeamRun

# The runner of plait_run_team with stamps: st[(i * threads + t) * 4 + 0..3] = wall before step i's barrier, after
# it, after the kernel (ns), and the thread's CPU ns spent in the kernel.
STAMPED = (
    TEAM_SYNC
    + """#include <omp.h>
typedef void (*plait_team_fn)(void* const*);
static long plait_cpu_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
void plait_run_team_stamped(int n, const plait_team_fn* fns, void* const* const* args, const unsigned char* sync,
                            plait_team_cell* cell, long* st) {
#pragma omp parallel
  {
    int threads = omp_get_num_threads(), me = omp_get_thread_num();
    for (int i = 0; i < n; i++) {
      long* s = st + ((long)i * threads + me) * 4;
      s[0] = plait_now_ns();
      if (sync[i]) plait_team_sync(cell, threads);
      s[1] = plait_now_ns();
      long c0 = plait_cpu_ns();
      fns[i](args[i]);
      s[3] = plait_cpu_ns() - c0;
      s[2] = plait_now_ns();
    }
  }
}
"""
)


def steal_ticks() -> int:
    """The host's stolen ticks so far, of every CPU (plait.bench.env.cpu_ticks; 0 where /proc/stat is missing)."""
    ticks = cpu_ticks()
    return ticks[0] if ticks else 0


def stamped_replays(
    device: object, run: TeamRun, threads: int, replays: int, pause: float = 0.0
) -> tuple[np.ndarray, list[float]]:
    """Replays of one team run at `threads` threads through the stamped runner, each after `pause` seconds of sleep:
    stamps (replays, steps, threads, 4) and each replay's wall ms."""
    lib = device._load(device._key(STAMPED), STAMPED)  # type: ignore[attr-defined]
    fn = lib.plait_run_team_stamped
    fn.restype = None
    n = len(run.fns)
    gomp = ctypes.CDLL("libgomp.so.1")
    gomp.omp_set_num_threads(threads)
    out = np.zeros((replays, n, threads, 4), dtype=np.int64)
    walls = []
    for r in range(replays + 2):
        if pause:
            time.sleep(pause)
        st = np.zeros(n * threads * 4, dtype=np.int64)
        t0 = time.perf_counter()
        fn(n, run.fns, run.table, run.sync, ctypes.byref(run.cell), st.ctypes.data_as(ctypes.c_void_p))
        if r >= 2:
            walls.append((time.perf_counter() - t0) * 1e3)
            out[r - 2] = st.reshape(n, threads, 4)
    return out, walls


def per_step(st: np.ndarray) -> dict[str, np.ndarray]:
    """Median over replays of each step's numbers (ms): the slowest thread's kernel wall time, the fastest one's,
    the time threads spent in the step's barrier (summed), the threads' kernel CPU time summed and its largest
    share (the critical path in CPU time, which the hypervisor's steal does not inflate), and the step's span
    (first thread into its barrier to last thread out of its kernel)."""
    work = (st[..., 2] - st[..., 1]) / 1e6
    wait = (st[..., 1] - st[..., 0]) / 1e6
    cpu = st[..., 3] / 1e6
    span = (st[..., 2].max(axis=2) - np.roll(st[..., 2].max(axis=2), 1, axis=1)) / 1e6
    span[:, 0] = (st[:, 0, :, 2].max(axis=1) - st[:, 0, :, 0].min(axis=1)) / 1e6
    return {
        "max": np.median(work.max(axis=2), axis=0),
        "min": np.median(work.min(axis=2), axis=0),
        "wait": np.median(wait.sum(axis=2), axis=0),
        "cpu": np.median(cpu.sum(axis=2), axis=0),
        "cpu max": np.median(cpu.max(axis=2), axis=0),
        "cpu min": np.median(cpu.min(axis=2), axis=0),
        "span": np.median(span, axis=0),
    }


def ort_sessions(model: str, folder: str) -> dict[int, Any]:
    """ONNX Runtime sessions of the exported net at one and two intra-op threads, its node profiler on."""
    import onnxruntime as ort

    data = export(model)
    out = {}
    for threads in (1, 2):
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(folder, f"ort{threads}")
        out[threads] = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return out


def ort_nodes_ms(sess: Any) -> dict[str, float]:
    """Each node's median profiled time (ms), summed per kind (bench_ort_nodes.node_kind: pointwise, conv, ...)
    and over all nodes ("all")."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    kinds: dict[str, str] = {}
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            times[e["name"]].append(e["dur"] / 1e3)
            kinds[e["name"]] = node_kind(e.get("args", {}))
    out: dict[str, float] = collections.defaultdict(float)
    for name, t in times.items():
        out[kinds[name]] += float(np.median(t))
        out["all"] += float(np.median(t))
    return {k: round(v, 2) for k, v in out.items()}


def build(model: str, batch: int, x: np.ndarray) -> tuple[object, TeamRun, np.ndarray]:
    """The twin's plan, its one team run over every kernel, and its output."""
    f = twin(model, "cpu")
    plan, _ = f.plan_for([x])
    y = np.asarray(f(x))
    runs = [r for r in plan.replay if isinstance(r, TeamRun)]
    if len(runs) != 1 or len(runs[0].fns) != len(plan.kernels):
        raise SystemExit(f"{model}: expected one team run over all {len(plan.kernels)} kernels")
    return plan, runs[0], y


def summary(plan: object, run: TeamRun, res: dict[int, tuple[np.ndarray, list[float]]]) -> dict[str, object]:
    """Whole-replay sums of per_step's medians at one and two threads, and the same per kind of kernel."""
    one, two = per_step(res[1][0]), per_step(res[2][0])
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * 5)
    for i, k in enumerate(plan.kernels):  # type: ignore[attr-defined]
        kind = kinds[k.name.split("_")[0]]
        for j, v in enumerate(
            (one["cpu"][i], two["cpu"][i], two["cpu max"][i], two["max"][i] - two["min"][i], two["span"][i])
        ):
            kind[j] += float(v)
    return {
        "barriers": sum(run.sync),
        "replay 1t ms (median)": round(float(np.median(res[1][1])), 2),
        "replay 2t ms (median)": round(float(np.median(res[2][1])), 2),
        "1t kernel cpu ms": round(float(one["cpu"].sum()), 2),
        "2t kernel cpu ms (both threads)": round(float(two["cpu"].sum()), 2),
        "2t slowest thread ms": round(float(two["max"].sum()), 2),
        "2t slowest thread cpu ms": round(float(two["cpu max"].sum()), 2),
        "2t imbalance ms (slowest - fastest)": round(float((two["max"] - two["min"]).sum()), 2),
        "2t cpu imbalance ms": round(float((two["cpu max"] - two["cpu min"]).sum()), 2),
        "2t kernel cpu ms per thread (median replay)": [
            round(float(v), 2) for v in np.median(res[2][0][..., 3].sum(axis=1), axis=0) / 1e6
        ],
        "2t barrier wait ms (both threads)": round(float(two["wait"].sum()), 2),
        "2t step spans ms": round(float(two["span"].sum()), 2),
        "by kind (1t cpu, 2t cpu, 2t slowest cpu, 2t imbalance, 2t span)": {
            k: [round(v, 2) for v in vs] for k, vs in kinds.items()
        },
    }


def add_ab(ap: argparse.ArgumentParser) -> None:
    """--ab OLD NEW (repeatable): a plan B whose kernel sources have OLD replaced by NEW, timed in the same rounds.
    Plan B tends to gain a little from being built second (docs/benchmarks.md, nineteenth session): run both orders."""
    ap.add_argument(
        "--ab",
        nargs=2,
        action="append",
        default=[],
        metavar=("OLD", "NEW"),
        help="also plan B: every kernel source with OLD replaced by NEW (repeat for more replacements)",
    )


def build_ab(model: str, batch: int, x: np.ndarray, ab: list[tuple[str, str]]) -> dict[str, Any]:
    """Plan A's `build`, and with `ab` (add_ab's pairs) plan B's from the kernel sources so patched."""
    plans = {"A": build(model, batch, x)}
    if ab:
        patched_compilers([(old, new) for old, new in ab])
        plans["B"] = build(model, batch, x)
    return plans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--replays", type=int, default=20, help="stamped replays at each thread count; medians count")
    ap.add_argument("--rounds", type=int, default=2, help="turns of the thread counts (and plans); all are pooled")
    ap.add_argument("--top", type=int, default=20, help="list this many steps, largest two-thread span first")
    ap.add_argument("--fifo", action="store_true", help="SCHED_FIFO priority 1 for every thread while timing (root)")
    add_ab(ap)
    ap.add_argument("--ort", action="store_true", help="also ONNX Runtime at one and two threads, same rounds")
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    plans = build_ab(args.model, args.batch, x, args.ab)
    folder = tempfile.TemporaryDirectory()
    sessions = ort_sessions(args.model, folder.name) if args.ort else {}
    ort_walls: dict[int, list[float]] = {1: [], 2: []}
    ort_y = [sess.run(None, {"x": x})[0] for sess in sessions.values()]
    steal0, t0, fma0 = steal_ticks(), time.time(), cpu_pair_fma()
    if args.fifo:
        scheduling(os.SCHED_FIFO, 1)
    res: dict[str, dict[int, tuple[np.ndarray, list[float]]]] = {k: {} for k in plans}
    for r in range(args.rounds):  # turns, so every plan and thread count sees the same minutes
        for label in list(plans) if r % 2 == 0 else list(plans)[::-1]:
            plan, run, _ = plans[label]
            for threads in (1, 2):
                st, walls = stamped_replays(plan.device, run, threads, args.replays)  # type: ignore[attr-defined]
                old = res[label].get(threads)
                res[label][threads] = (st, walls) if old is None else (np.concatenate([old[0], st]), old[1] + walls)
        for threads, sess in sessions.items():
            sess.run(None, {"x": x})
            for _ in range(args.replays):
                t1 = time.perf_counter()
                sess.run(None, {"x": x})
                ort_walls[threads].append((time.perf_counter() - t1) * 1e3)
            if args.fifo:  # ORT's new pool threads join the real-time class too
                scheduling(os.SCHED_FIFO, 1)
    if args.fifo:
        scheduling(os.SCHED_OTHER, 0)
    steal = (steal_ticks() - steal0) / (100 * 2 * (time.time() - t0))
    out: dict[str, object] = {
        "model": args.model,
        "batch": args.batch,
        "load": round(os.getloadavg()[0], 2),
        "steal share": round(steal, 3),
        "pair FMA rate (start, end; near 0.5: one core)": [fma0, cpu_pair_fma()],
    }
    for label, (plan, run, y) in plans.items():
        out[label] = summary(plan, run, res[label])
        if label != "A":
            out[f"{label} max abs diff"] = float(np.abs(y - plans["A"][2]).max())
    if sessions:
        ort_ms = {t: float(np.median(w)) for t, w in ort_walls.items()}
        out["ORT"] = {
            "max abs diff vs A": float(max(np.abs(y - plans["A"][2]).max() for y in ort_y)),
            "1t wall ms (median)": round(ort_ms[1], 2),
            "2t wall ms (median)": round(ort_ms[2], 2),
            "1t nodes ms": ort_nodes_ms(sessions[1]),
            "2t nodes ms": ort_nodes_ms(sessions[2]),
        }
        for label in plans:
            walls = {t: float(np.median(res[label][t][1])) for t in (1, 2)}
            out[f"{label} / ORT wall (1t, 2t)"] = [round(walls[t] / ort_ms[t], 3) for t in (1, 2)]
    folder.cleanup()
    print(json.dumps(out))
    plan, run, _ = plans["A"]
    one, two = per_step(res["A"][1][0]), per_step(res["A"][2][0])
    other = per_step(res["B"][2][0]) if "B" in plans else None
    print("  step  span2t  slow2t  fast2t  cpumax2t  cpumin2t  cpu2t/cpu1t  cpu1t  sync  [B span2t]  kernel")
    for i in np.argsort(-two["span"])[: args.top]:
        b = f"{other['span'][i]:7.3f}" if other is not None else ""
        print(
            f"  {i:4d} {two['span'][i]:7.3f} {two['max'][i]:7.3f} {two['min'][i]:7.3f} "
            f"{two['cpu max'][i]:8.3f} {two['cpu min'][i]:8.3f} "
            f"{two['cpu'][i] / max(one['cpu'][i], 1e-9):8.3f} {one['cpu'][i]:9.3f} {run.sync[i]:4d} {b} "
            f"{plan.kernels[i].name}"  # type: ignore[attr-defined]
        )


if __name__ == "__main__":
    main()
