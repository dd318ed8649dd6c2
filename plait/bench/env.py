"""Thread settings and the record of everything in the environment that changes a benchmark result.

`set_threads` must run before torch or onnxruntime is imported: OpenMP reads OMP_NUM_THREADS and OMP_WAIT_POLICY
once, and without PASSIVE waiting PyTorch's idle threads spin and steal the cores the other frameworks need.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import subprocess
import sys
import time
from typing import Any


def set_threads(n: int) -> dict[str, str]:
    """Give every framework the same `n` threads (and passive OpenMP waiting); returns the variables set."""
    env = {
        "OMP_NUM_THREADS": str(n),
        "MKL_NUM_THREADS": str(n),
        "OPENBLAS_NUM_THREADS": str(n),
        "OMP_WAIT_POLICY": "PASSIVE",
        "PLAIT_NUM_THREADS": str(n),
    }
    os.environ.update(env)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return env


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def load_average() -> list[float]:
    """The 1/5/15-minute load average: other work on the machine skews every timing, so it goes in the record."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def cpu_ticks() -> tuple[int, int] | None:
    """(ticks the hypervisor stole, all ticks) of every CPU since boot, from /proc/stat's "cpu" line (user, nice,
    system, idle, iowait, irq, softirq, steal; guest time is inside user); None where there is no such file."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (fields[7], sum(fields)) if len(fields) == 8 else None


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPUs' time the hypervisor took between two cpu_ticks() readings (a guest's vCPU waiting
    for a host core: the run's threads stood still for it); None without both readings or with no ticks between."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


def steal_text(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str:
    """steal_share as a percentage for a benchmark's printout ("n/a" where it is unknown)."""
    share = steal_share(before, after)
    return "n/a" if share is None else f"{share:.1%}"


# Two threads pinned to two CPUs hand one cache line back and forth: the round trip says how far apart the host put
# those CPUs. A KVM guest's vCPUs move between host cores: on the 2-vCPU Zen 5 guest of 2026-11-23 the pair was
# ~95 ns apart (one L3) or ~440 ns (separate L3s) for seconds to minutes at a time, and two-thread timings follow it
# (plait resnet50 b1 18.3 against 22.0 ms, ONNX Runtime 19.5 against 21.0; docs/benchmarks.md, eleventh session).
_PAIR_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <time.h>
static volatile long flag __attribute__((aligned(64)));
static volatile int go;
typedef struct { int cpu, ok; long rounds; double ns; } side_t;
static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
static int pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return !sched_setaffinity(0, sizeof set, &set);
}
/* The first side sends 2i+1 and waits for 2i+2, for `rounds` rounds or until 50 ms have passed (a loaded machine
   runs the two spinning threads in turns, a time slice a round), then -2 to stop the other side. */
static void* first(void* arg) {
  side_t* s = arg;
  s->ok = pin(s->cpu);
  while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE)) {
  }
  double t0 = now_ns(), until = t0 + 50e6;
  long i = 0;
  while (i < s->rounds) {
    __atomic_store_n(&flag, 2 * i + 1, __ATOMIC_RELEASE);
    while (__atomic_load_n(&flag, __ATOMIC_ACQUIRE) != 2 * i + 2) {
    }
    i++;
    if (i % 64 == 0 && now_ns() > until) break;
  }
  s->ns = (now_ns() - t0) / (i ? i : 1);
  __atomic_store_n(&flag, -2, __ATOMIC_RELEASE);
  return 0;
}
static void* second(void* arg) {
  side_t* s = arg;
  s->ok = pin(s->cpu);
  for (long want = 1;; want += 2) {
    long f;
    while ((f = __atomic_load_n(&flag, __ATOMIC_ACQUIRE)) != want && f != -2) {
    }
    if (f == -2) break;
    __atomic_store_n(&flag, want + 1, __ATOMIC_RELEASE);
  }
  return 0;
}
/* Round trip in ns of up to n hand-overs between threads pinned to CPUs a and b; -1 when a thread could not be
   pinned. */
double host_pair_ns(int a, int b, int n) {
  pthread_t ta, tb;
  side_t sa = {a, 0, n, 0}, sb = {b, 0, n, 0};
  flag = 0;
  go = 0;
  pthread_create(&ta, 0, first, &sa);
  pthread_create(&tb, 0, second, &sb);
  struct timespec pause = {0, 2000000}; /* both threads pinned before the first round */
  nanosleep(&pause, 0);
  __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
  pthread_join(ta, 0);
  pthread_join(tb, 0);
  return sa.ok && sb.ok ? sa.ns : -1;
}
/* Twelve independent chains of 8-float multiply-adds, registers only, for `iters` rounds on a pinned thread: its
   rounds per ns. */
typedef float fma_v8 __attribute__((vector_size(32)));
typedef struct { int cpu, ok; long iters; double rate; } fma_t;
static volatile int fma_go;
static void* fma_side(void* arg) {
  fma_t* s = arg;
  s->ok = pin(s->cpu);
  while (!__atomic_load_n(&fma_go, __ATOMIC_ACQUIRE)) {
  }
  fma_v8 acc[12], b = {0}, c = {0};
  b += 0.9999f;
  c += 1e-4f;
  for (int i = 0; i < 12; i++) acc[i] = b * (float)i;
  double t0 = now_ns();
  for (long r = 0; r < s->iters; r++)
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i] = acc[i] * b + c;
  s->rate = s->iters / (now_ns() - t0);
  volatile float sink = 0;
  for (int i = 0; i < 12; i++) sink += acc[i][0];
  return 0;
}
static void fma_run(fma_t* sides, int n) {
  pthread_t t[2];
  fma_go = 0;
  for (int i = 0; i < n; i++) pthread_create(&t[i], 0, fma_side, &sides[i]);
  struct timespec pause = {0, 2000000};
  nanosleep(&pause, 0);
  __atomic_store_n(&fma_go, 1, __ATOMIC_RELEASE);
  for (int i = 0; i < n; i++) pthread_join(t[i], 0);
}
/* The multiply-add rate of threads pinned to CPUs a and b running at once, relative to one on a alone (the slower
   of the two against the best of two runs alone): about 1 where the two are separate cores, about 0.5 where the host
   runs them on one core's two hardware threads, or in turns; -1 when a thread could not be pinned. */
double host_pair_fma(int a, int b, long iters) {
  fma_t alone[2] = {{a, 0, iters, 0}, {a, 0, iters, 0}}, both[2] = {{a, 0, iters, 0}, {b, 0, iters, 0}};
  fma_run(&alone[0], 1);
  fma_run(both, 2);
  fma_run(&alone[1], 1);
  double solo = alone[0].rate > alone[1].rate ? alone[0].rate : alone[1].rate;
  double pair = both[0].rate < both[1].rate ? both[0].rate : both[1].rate;
  return alone[0].ok && both[0].ok && both[1].ok && solo > 0 ? pair / solo : -1;
}
"""


@functools.cache
def _pair_lib() -> ctypes.CDLL | None:
    """The round-trip probe, built and loaded the way the cpu device builds its kernels (its compiler and flags,
    cached on disk); None when the cpu device has no compiler or the build fails."""
    from plait.errors import PlaitError
    from plait.runtime import get_device

    try:
        device = get_device("cpu")
        lib = device._load(device._key(_PAIR_SOURCE), _PAIR_SOURCE)  # type: ignore[attr-defined]
    except PlaitError:
        return None
    lib.host_pair_ns.restype = ctypes.c_double
    lib.host_pair_ns.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.host_pair_fma.restype = ctypes.c_double
    lib.host_pair_fma.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long]
    return lib


def _pair() -> tuple[ctypes.CDLL, int, int] | None:
    """The probes' library and the first two CPUs this process may use; None with fewer than two, off Linux, or
    without a C compiler."""
    if not sys.platform.startswith("linux"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    lib = _pair_lib() if len(cpus) >= 2 else None
    return None if lib is None else (lib, cpus[0], cpus[1])


def cpu_pair_ns(rounds: int = 20000) -> float | None:
    """The round trip (ns) of a cache line between threads pinned to the first two CPUs this process may use; None
    with fewer than two, off Linux, or without a C compiler. Takes a few milliseconds of both CPUs."""
    pair = _pair()
    if pair is None:
        return None
    ns = pair[0].host_pair_ns(pair[1], pair[2], rounds)
    return round(ns, 1) if ns >= 0 else None


# The same KVM guest's two vCPUs, on the Zen 3 host of 2026-11-24, also spent stretches of seconds where two threads
# each got half the multiply-add rate of one thread alone (51 against 100 GFLOP/s, their CPU time still the whole
# wall time): the host ran both vCPUs on one physical core. A compute-bound two-thread run then takes about as long
# as a one-thread run, whatever the framework (docs/benchmarks.md, twentieth session).
def cpu_pair_fma(iters: int = 2_000_000) -> float | None:
    """The multiply-add rate of each of two threads pinned to the first two CPUs this process may use, running at
    once, relative to one thread alone (the slower of the pair against the better of two runs alone), the median of
    three such measurements: about 1.0 on two separate cores, about 0.5 when the host shares one core between them.
    Another job on the machine disturbs it either way (a run alone that another thread slowed reads above 1). None with
    fewer than two CPUs, off Linux, or without a C compiler. Takes about 60 ms of both CPUs."""
    pair = _pair()
    if pair is None:
        return None
    ratios = sorted(pair[0].host_pair_fma(pair[1], pair[2], iters) for _ in range(3))
    return round(ratios[1], 3) if ratios[0] >= 0 else None


def environment(threads: int, plait_devices: list[str]) -> dict[str, Any]:
    """Versions, host, devices and drivers, thread variables: what a reader needs to reproduce the numbers."""
    import numpy as np

    import plait
    from plait.runtime import get_device

    versions: dict[str, str] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "plait": plait.__version__,
    }
    for mod in ("torch", "onnx", "onnxruntime", "tinygrad", "tensorflow", "matplotlib"):
        if mod in sys.modules:
            versions[mod] = str(getattr(sys.modules[mod], "__version__", "?"))
    devices = {}
    for name in plait_devices:
        info = get_device(name).info
        devices[name] = {
            "kind": info.kind,
            "name": info.name,
            "driver": info.driver,
            "compute_units": info.compute_units,
            "memory_gib": round(info.memory_bytes / 2**30, 1),
        }
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": {
            "platform": platform.platform(),
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "nvidia": _nvidia_driver(),
            "load_average_end": load_average(),
            "cpu_pair_ns_end": cpu_pair_ns(),
            "cpu_pair_fma_end": cpu_pair_fma(),
        },
        "git_commit": _git_commit(),
        "versions": versions,
        "plait_devices": devices,
        "threads": threads,
        "thread_env": {
            k: os.environ.get(k, "")
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "PLAIT_NUM_THREADS")
        },
    }


def torch_settings(torch: Any, tf32: bool, cudnn_benchmark: bool) -> dict[str, Any]:
    """Apply and record the PyTorch switches that change speed or numerics."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark
    cuda = torch.cuda.is_available()
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "tf32": tf32,
        "cudnn_benchmark": cudnn_benchmark,
        "cuda": torch.version.cuda if cuda else None,
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
    }
