"""How far apart the host placed two of this machine's CPUs right now: the round trip of one cache line between a
thread pinned to the first allowed CPU and one pinned to the second (ns), plait.bench.env.cpu_pair_ns.

On the 2-vCPU KVM guest of 2026-11-23 (AMD EPYC Zen 5) the host moves the two vCPUs, every few seconds to minutes,
between a "near" placement (~95 ns: one L3) and a "far" one (~440 ns: separate L3s). Single-thread speed and DRAM
streaming are the same in both, but two threads that hand data to each other are not: plait's resnet50 b1 two-thread
replay took 18.3 ms near and 22.0 ms far, ONNX Runtime ~19.5 and ~21.0 (docs/benchmarks.md, eleventh session).
bench_onnx.py prints this number beside each row, `plait bench` records it at the start and end of a run.

    .venv/bin/python benchmarks/host_pair.py          # one reading a second, ten of them
"""

from __future__ import annotations

import time

from plait.bench.env import cpu_pair_ns


def describe(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns:.0f}"


def pair_ns() -> float | None:
    return cpu_pair_ns()


if __name__ == "__main__":
    for _ in range(10):
        print(
            f"{time.strftime('%H:%M:%S', time.gmtime())} UTC CPU pair round trip {describe(pair_ns())} ns", flush=True
        )
        time.sleep(1.0)
