"""How far apart the host placed two of this machine's CPUs right now: the round trip of one cache line between a
thread pinned to the first allowed CPU and one pinned to the second (ns).

On the 2-vCPU KVM guest of 2026-11-23 (AMD EPYC Zen 5) the host moves the two vCPUs, every few seconds to minutes,
between a "near" placement (~95 ns: one L3) and a "far" one (~440 ns: separate L3s). Single-thread speed and DRAM
streaming are the same in both, but two threads that hand data to each other are not: plait's resnet50 b1 two-thread
replay took 18.3 ms near and 22.0 ms far, ONNX Runtime ~19.5 and ~21.0 (docs/benchmarks.md, eleventh session). The
benchmarks print this number beside two-thread timings so a reader can tell which placement a row ran in.

    .venv/bin/python benchmarks/host_pair.py          # one reading a second, ten of them
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <time.h>
static volatile long flag __attribute__((aligned(64)));
static int rounds;
typedef struct { int cpu, side, ok; } side_t;
static void* play(void* arg) {
  side_t* s = arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(s->cpu, &set);
  s->ok = !sched_setaffinity(0, sizeof set, &set);
  for (long i = 0; i < rounds; i++) {
    long want = 2 * i + s->side, next = want + 1;
    while (__atomic_load_n(&flag, __ATOMIC_ACQUIRE) != want) {
    }
    __atomic_store_n(&flag, next, __ATOMIC_RELEASE);
  }
  return 0;
}
/* Round trip in ns of `n` hand-overs between threads pinned to CPUs a and b; -1 when a thread could not be pinned. */
double host_pair_ns(int a, int b, int n) {
  pthread_t ta, tb;
  side_t sa = {a, 0, 0}, sb = {b, 1, 0};
  struct timespec t0, t1;
  rounds = n;
  flag = -1;
  pthread_create(&ta, 0, play, &sa);
  pthread_create(&tb, 0, play, &sb);
  struct timespec pause = {0, 2000000}; /* both threads pinned and spinning before the clock starts */
  nanosleep(&pause, 0);
  clock_gettime(CLOCK_MONOTONIC, &t0);
  __atomic_store_n(&flag, 0, __ATOMIC_RELEASE);
  pthread_join(ta, 0);
  pthread_join(tb, 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (!sa.ok || !sb.ok) return -1;
  return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / n;
}
"""


@functools.cache
def _lib() -> ctypes.CDLL | None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not sys.platform.startswith("linux"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="plait-host-pair-"))
    src, lib = folder / "pair.c", folder / "pair.so"
    src.write_text(SOURCE)
    subprocess.run([cc, "-O2", "-pthread", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    dll = ctypes.CDLL(str(lib))
    dll.host_pair_ns.restype = ctypes.c_double
    dll.host_pair_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    return dll


def pair_ns(rounds: int = 20000) -> float | None:
    """The round trip (ns) between the first two CPUs this process may use, or None with fewer than two CPUs, no C
    compiler or not on Linux. Takes a few milliseconds on both CPUs."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    lib = _lib() if len(cpus) >= 2 else None
    if lib is None:
        return None
    ns = lib.host_pair_ns(cpus[0], cpus[1], rounds)
    return ns if ns >= 0 else None


def describe(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns:.0f}"


if __name__ == "__main__":
    for _ in range(10):
        print(f"{time.strftime('%H:%M:%S')} CPU pair round trip {describe(pair_ns())} ns", flush=True)
        time.sleep(1.0)
