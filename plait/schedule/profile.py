"""The per-kernel report: each kernel of a compiled plan with its work (FLOPs, bytes), its median time from a
profiling replay, and how close it comes to the device's measured peaks (`plait devices --measure`).

Work is counted from the scheduler's item, not measured: a GEMM does 2*M*N*K*batch FLOPs plus one per fused
epilogue op per output element; a Winograd convolution on the cpu and a fused inverted-residual block count two
FLOPs per multiply-add of the direct products they stand for (the block's expand, 3x3 depthwise and projection),
not the fewer a transform does nor their epilogues; an elementwise kernel one FLOP per arithmetic op of its fused expression per output
element; a reduction one per input element plus its fused input expression; data-movement kernels (im2col, gathers)
none. Bytes are the compulsory traffic: every buffer the kernel reads once, plus the buffer it writes.

>>> import numpy as np, plait                                                  # doctest: +SKIP
>>> f = plait.jit(lambda a, b: (a @ b).relu(), device="cpu")                  # doctest: +SKIP
>>> print(plait.explain(f, np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)))  # doctest: +SKIP
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from plait.errors import PlaitError
from plait.graph.node import Node
from plait.graph.ops import kind
from plait.runtime.base import Device
from plait.schedule.plan import Plan
from plait.schedule.scheduler import Item

_ARITH_FREE = {"cast"}  # elementwise ops that move or relabel data without arithmetic
_PEAKS: dict[str, dict[str, float]] = {}


def _nbytes(node: Node) -> int:
    return node.size * node.dtype.itemsize


def _expr_ops(root: Node, stop: set[int]) -> list[str]:
    """The elementwise ops of the expression fused into a kernel under `root`, each node once, stopping at
    buffers (realized nodes and the kernel's inputs, `stop`)."""
    ops: list[str] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n.uid in seen or n.uid in stop or n.realized:
            continue
        seen.add(n.uid)
        k = kind(n)
        if k == "elementwise" and n.op not in _ARITH_FREE and n.op != "const":
            ops.append(n.op)
        if k in ("elementwise", "movement") or n is root:
            stack.extend(n.srcs)
    return ops


def item_work(item: Item) -> tuple[int, int, list[str]]:
    """(FLOPs, bytes moved, fused op names) of one kernel item, counted as the module docstring says."""
    inputs = {x.uid: x for x in item.inputs}
    moved = _nbytes(item.out) + sum(_nbytes(x) for x in inputs.values())
    if item.kind in ("gemm", "pointwise"):
        assert item.gemm is not None
        epi = item.extra.get("epilogue")
        ops = _expr_ops(item.out, set(inputs) | {epi.uid}) if epi is not None else []
        return item.gemm.flops + len(ops) * item.out.size, moved, ["matmul", *ops]
    if item.kind == "stempool":  # an image stem and its max pool (plait/codegen/stem_pool_c.py)
        assert item.gemm is not None
        return item.gemm.flops, moved, ["matmul", item.out.op]
    if item.kind == "winograd" and item.gemm is not None:  # the C form: counted as the convolution it computes
        return item.gemm.flops, moved, ["matmul", item.out.op]
    if item.kind == "irblock":  # a fused inverted-residual block (plait/codegen/irblock_c.py): its three products
        p = item.extra["irblock"]
        expand = p.cin * p.c1 * p.h * p.w if p.expand else 0
        return 2 * p.images * (expand + 9 * p.c1 * p.ho * p.wo + p.c1 * p.m2 * p.ho * p.wo), moved, ["matmul"] * 3
    if item.kind == "elementwise":
        ops = _expr_ops(item.out, set(inputs))
        return len(ops) * item.out.size, moved, ops
    if item.kind == "reduce":
        src = item.out.srcs[0]
        ops = _expr_ops(src, set(inputs)) if src.uid not in inputs else []
        return (1 + len(ops)) * src.size, moved, [item.out.op, *ops]
    if item.kind == "contract":
        points = math.prod(hi - lo for _, lo, hi in item.out.arg.ranges)
        return 2 * points, moved, [item.out.op]  # one multiply and one accumulate per index point
    return 0, moved, [item.out.op]


def _shape(item: Item) -> str:
    if item.gemm is not None:
        g = item.gemm
        return f"b{g.batch} m{g.m} n{g.n} k{g.k}"
    out = "x".join(map(str, item.out.shape)) or "scalar"
    if item.kind == "reduce":
        return "x".join(map(str, item.out.srcs[0].shape)) + f" -> {out}"
    return out


def peaks(device: Device, tries: int = 3) -> dict[str, float]:
    """The device's peak GFLOP/s and GB/s (plait.runtime.discovery.measure_peak), the best of `tries`
    measurements, measured once per process: on a shared machine a single measurement can catch a busy moment."""
    if device.name not in _PEAKS:
        from plait.runtime.discovery import measure_peak

        runs = [measure_peak(device) for _ in range(tries)]
        _PEAKS[device.name] = {key: max(r[key] for r in runs) for key in ("peak_gflops", "peak_gbps")}
    return _PEAKS[device.name]


@dataclass
class KernelStat:
    """One launch of a plan: what it computes, its work, and its median time over the profiling replays."""

    index: int  # launch position in its plan
    name: str
    kind: str
    ops: str
    shape: str
    flops: int
    bytes: int
    time_s: float
    group: str = ""  # which plan it belongs to, when a report covers several

    @property
    def gflops(self) -> float:
        return self.flops / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes / self.time_s / 1e9 if self.time_s > 0 else 0.0


@dataclass
class KernelReport:
    """Every kernel of one or more plans, sorted by time (slowest first), with totals and the device's peaks.
    `replay_s` is the median time of whole replays, so `replay_s - total_s` is what launching costs between kernels.
    """

    device: str
    device_name: str
    peak_gflops: float
    peak_gbps: float
    reps: int
    replay_s: float
    kernels: list[KernelStat] = field(default_factory=list)
    memory_bytes: int = 0  # the plans' own buffers (Plan.peak_bytes), intermediates sharing storage
    unshared_bytes: int = 0  # the same if every intermediate had a buffer of its own

    @property
    def total_s(self) -> float:
        return sum(k.time_s for k in self.kernels)

    @property
    def total_flops(self) -> int:
        return sum(k.flops for k in self.kernels)

    @property
    def total_bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the settings, totals, and one row per kernel with the derived rates."""
        rows = []
        for k in self.kernels:
            row = asdict(k)
            row.update(_rates(k.flops, k.bytes, k.time_s, self.peak_gflops, self.peak_gbps))
            rows.append(row)
        totals = {
            "kernels": len(self.kernels),
            "time_s": self.total_s,
            "flops": self.total_flops,
            "bytes": self.total_bytes,
            **_rates(self.total_flops, self.total_bytes, self.total_s, self.peak_gflops, self.peak_gbps),
        }
        kinds: dict[str, dict[str, Any]] = {}
        for k in self.kernels:
            agg = kinds.setdefault(k.kind, {"kernels": 0, "time_s": 0.0, "flops": 0, "bytes": 0})
            agg["kernels"] += 1
            agg["time_s"] += k.time_s
            agg["flops"] += k.flops
            agg["bytes"] += k.bytes
        for agg in kinds.values():
            agg.update(_rates(agg["flops"], agg["bytes"], agg["time_s"], self.peak_gflops, self.peak_gbps))
        return {
            "device": self.device,
            "device_name": self.device_name,
            "peak_gflops": self.peak_gflops,
            "peak_gbps": self.peak_gbps,
            "reps": self.reps,
            "replay_s": self.replay_s,
            "memory_bytes": self.memory_bytes,
            "unshared_bytes": self.unshared_bytes,
            "totals": totals,
            "by_kind": kinds,
            "kernels": rows,
        }

    def __str__(self) -> str:
        return format_report(self.as_dict())


def _rates(flops: int, nbytes: int, t: float, peak_gflops: float, peak_gbps: float) -> dict[str, float]:
    gflops = flops / t / 1e9 if t > 0 else 0.0
    gbps = nbytes / t / 1e9 if t > 0 else 0.0
    return {
        "gflops": gflops,
        "gbps": gbps,
        "flop_peak_pct": 100 * gflops / peak_gflops if peak_gflops else 0.0,
        "bw_peak_pct": 100 * gbps / peak_gbps if peak_gbps else 0.0,
    }


def format_report(report: dict[str, Any], limit: int | None = None) -> str:
    """A markdown table of a report's dict form (`KernelReport.as_dict`), slowest kernels first, with totals;
    `limit` keeps only the slowest rows (the totals still cover all of them)."""
    t = report["totals"]
    head = (
        f"{t['kernels']} kernels on {report['device']} ({report['device_name']}): {t['time_s'] * 1e3:.3f} ms in "
        f"kernels, {report['replay_s'] * 1e3:.3f} ms per replay (median of {report['reps']}); "
        f"peaks {report['peak_gflops']:.1f} GFLOP/s, {report['peak_gbps']:.1f} GB/s (measured)"
    )
    if report.get("memory_bytes"):
        head += (
            f"; peak {report['memory_bytes'] / 2**20:.1f} MB in the plans' buffers"
            f" ({report['unshared_bytes'] / 2**20:.1f} MB unshared)"
        )
    header = ["#", "kernel", "kind", "ops", "shape", "ms", "%time", "GFLOP/s", "GB/s", "%peak FLOP", "%peak BW"]
    rows = report["kernels"][:limit] if limit is not None else report["kernels"]
    total = t["time_s"] or 1.0
    kinds = sorted(report.get("by_kind", {}).items(), key=lambda kv: -kv[1]["time_s"])
    by_kind = "; ".join(
        f"{kind} {k['time_s'] * 1e3:.3f} ms ({100 * k['time_s'] / total:.0f}%, {k['kernels']} kernels, "
        f"{k['gflops']:.1f} GFLOP/s, {k['gbps']:.1f} GB/s)"
        for kind, k in kinds
    )
    lines = [head, "", f"By kind: {by_kind}", ""] if by_kind else [head, ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        where = f"{r['group']}:{r['index']}" if r.get("group") else str(r["index"])
        cells = [where, r["name"], r["kind"], r["ops"], r["shape"], f"{r['time_s'] * 1e3:.3f}"]
        cells += [f"{100 * r['time_s'] / total:.1f}", f"{r['gflops']:.1f}", f"{r['gbps']:.1f}"]
        cells += [f"{r['flop_peak_pct']:.1f}", f"{r['bw_peak_pct']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    if limit is not None and len(report["kernels"]) > limit:
        lines.append(f"| | ... {len(report['kernels']) - limit} more | | | | | | | | | |")
    lines.append(
        f"| | **total** | | | | {t['time_s'] * 1e3:.3f} | 100.0 | {t['gflops']:.1f} | {t['gbps']:.1f} "
        f"| {t['flop_peak_pct']:.1f} | {t['bw_peak_pct']:.1f} |"
    )
    return "\n".join(lines)


def _describe(plan: Plan) -> list[tuple[str, str, str, int, int]]:
    """(kind, ops, shape, FLOPs, bytes) per launch of `plan`, in launch order."""
    out = []
    for item in plan.launched:
        flops, nbytes, ops = item_work(item)
        out.append((item.kind, "+".join(dict.fromkeys(ops)), _shape(item), flops, nbytes))
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def profile_plans(
    plans: Iterable[Plan], reps: int = 10, warmup: int = 1, groups: Iterable[str] | None = None
) -> KernelReport:
    """Replay each plan `warmup` times, then `reps` times kernel by kernel (each launch timed alone by its device:
    host clocks around a synchronous call on the cpu, profiling events on OpenCL) and `reps` times whole; report
    the median per kernel. The plans must have run once already, so their buffers hold real data."""
    plans = list(plans)
    if not plans:
        raise PlaitError("kernel report: there is no compiled plan to profile (did the model run in plait?)")
    if reps < 1:
        raise PlaitError(f"kernel report: reps must be at least 1, got {reps}")
    device = plans[0].device
    if any(p.device is not device for p in plans):
        raise PlaitError(
            f"kernel report: the plans run on {sorted({p.device.name for p in plans})}; profile one device"
        )
    names = list(groups) if groups is not None else [""] * len(plans)
    stats: list[KernelStat] = []
    replay = 0.0
    for plan, group in zip(plans, names, strict=True):
        for _ in range(warmup):
            plan.run()
        device.synchronize()
        samples: list[list[float]] = [[] for _ in plan.launches]
        whole: list[float] = []
        for _ in range(reps):
            for i, launch in enumerate(plan.launches):
                samples[i].append(device.time_launch(launch))
            t0 = time.perf_counter()
            plan.run()
            device.synchronize()
            whole.append(time.perf_counter() - t0)
        replay += _median(whole)
        for i, (kernel, (knd, ops, shape, flops, nbytes), ts) in enumerate(
            zip(plan.kernels, _describe(plan), samples, strict=True)
        ):
            stats.append(KernelStat(i, kernel.name, knd, ops, shape, flops, nbytes, _median(ts), group))
    stats.sort(key=lambda k: -k.time_s)
    p = peaks(device)
    memory = sum(plan.peak_bytes for plan in plans), sum(plan.unshared_bytes for plan in plans)
    return KernelReport(device.name, device.info.name, p["peak_gflops"], p["peak_gbps"], reps, replay, stats, *memory)


def profile_plan(plan: Plan, reps: int = 10, warmup: int = 1) -> KernelReport:
    """The per-kernel report of one plan (see `profile_plans`)."""
    return profile_plans([plan], reps, warmup)
