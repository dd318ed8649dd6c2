"""A `cpu` plan's kernels as the steps of one OpenMP parallel region (plait_run_team): the runner's C source, the
run's shared cell (buffer, barrier state), and which steps must wait for the ones before them. plait/runtime/cpu.py
`CPUDevice.chain` makes a TeamRun of each run of consecutive kernels with team entries (plait/codegen/c.py).
"""

from __future__ import annotations

import ctypes
import functools
import re
import weakref
from typing import Any

from plait import settings
from plait.codegen.c import TEAM_SYNC

# Kernels as steps of one parallel region: every thread of the team runs each kernel's team entry in turn, so the
# (passive, sleeping) threads are woken once per call instead of once per kernel, and one ctypes call replaces one
# per kernel. A step waits at the team's barrier (TEAM_SYNC: a short spin, then a futex) only where `sync` says it
# reads or overwrites what the steps since the last barrier wrote or read; the last step's writes are complete when
# the region ends.
TEAM_RUNNER = (
    TEAM_SYNC
    + """#include <string.h>
typedef void (*plait_team_fn)(void* const*);
/* Copy n bytes with the team's thread count, each thread a contiguous share (64-byte aligned cuts): a plan's input
   (plait/runtime/cpu.py CPUAllocator.copy_in). mobilenet_v2's 9.6 MB batch-16 input took one thread 1.3-1.6 ms back
   to back and 4.8-5.1 ms after a pause; the threads then also wake before the replay's region. */
void plait_copy_team(int want, char* dst, const char* src, long n) {
  int threads = want > 0 ? want : omp_get_max_threads();
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    long a = n * t / nt / 64 * 64, b = t + 1 == nt ? n : n * (t + 1) / nt / 64 * 64;
    if (b > a) memcpy(dst + a, src + a, (size_t)(b - a));
  }
}
/* Free a team run's shared buffer (plait/codegen/c.py TEAM_CELL). */
void plait_team_release(plait_team_cell* cell) {
  free(cell->buf);
  cell->buf = 0;
  cell->cap = 0;
}
/* A KVM guest's scheduler treats a vCPU that idled long enough for the host to deschedule it as busy, so an unpinned
   worker woken after a pause lands on its waker's CPU and waits there for it (0.7-1.4 ms at a region's start) or
   shares it; pinned, it wakes on its own CPU. A worker pins itself, on its first team run, to the CPU it runs on
   (another one if a teammate holds that); before each region the caller re-pins a worker whose CPU it now runs on
   itself. The caller is never pinned. Teams larger than the allowed CPUs, and `pin` 0 (PLAIT_PIN_THREADS=0), leave
   placement to the scheduler. */
static plait_team_place plait_place = {.bytes = -1};
static int plait_pid;
void plait_run_team(int want, int pin, int n, const plait_team_fn* fns, void* const* const* args,
                    const unsigned char* sync, plait_team_cell* cell) {
  plait_team_place* p = &plait_place;
  int threads = want > 0 ? want : omp_get_max_threads();
  cell->place = 0;
#ifdef __linux__
  if (plait_pid != getpid()) { /* a forked child: its pool threads are not the parent's */
    for (int t = 0; t < PLAIT_TEAM_WHERE; t++) p->tids[t] = 0;
    plait_pid = getpid();
  }
  if (p->bytes < 0) {
    p->bytes = syscall(SYS_sched_getaffinity, 0, sizeof p->mask, p->mask);
    for (long w = 0; p->bytes > 0 && w < (p->bytes + 7) / 8; w++) p->allowed += __builtin_popcountl(p->mask[w]);
  }
  unsigned home = 0;
  if (pin && threads > 1 && threads <= p->allowed && threads <= PLAIT_TEAM_WHERE && !syscall(SYS_getcpu, &home, 0, 0)) {
    cell->place = p;
    p->where[0] = (int)home;
    for (int t = 1; t < threads; t++) {
      if (!p->tids[t] || p->where[t] != (int)home) continue;
      if (syscall(SYS_tgkill, plait_pid, p->tids[t], 0)) { /* gone (never expected of a pool thread) */
        p->tids[t] = 0;
        continue;
      }
      int cand = plait_team_free_cpu(p, t, threads, home);
      if (cand >= 0 && !plait_team_pin(p->tids[t], cand)) p->where[t] = cand;
    }
  }
#endif
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), team = omp_get_num_threads();
#ifdef __linux__
    if (t && team == threads && cell->place && !p->tids[t]) {
      unsigned now = 0;
      syscall(SYS_getcpu, &now, 0, 0);
      p->where[t] = -1;
      int cand = plait_team_held(p, t, threads, (int)now) ? plait_team_free_cpu(p, t, threads, now) : (int)now;
      if (cand >= 0 && !plait_team_pin(0, cand)) p->where[t] = cand;
      p->tids[t] = (int)syscall(SYS_gettid);
    }
#endif
    for (int i = 0; i < n; i++) {
      if (sync[i]) plait_team_sync(cell, team);
      fns[i](args[i]);
    }
  }
}
"""
)


# How long a thread that reaches a team barrier first spins before it sleeps. It yields the core every few
# microseconds while it spins, so another job's thread on the same core still runs. On a 2-vCPU KVM guest every futex
# sleep costs more than the wait it saves: the host deschedules an idle vCPU, the guest then places the woken thread
# beside its waker, and the pair shares one CPU (plait_team_spread moves it back, after the harm). resnet18 at batch 1
# after a 0.2 s pause took 20.7 ms with a 60 us spin, 11.5 with 300 us, 11.3 with 1 ms (64, 4 and 2 sleeps a call;
# benchmarks/bench_team_barrier.py --cold, 2026-11-23); back to back 8.2 ms with 60 us, 7.9 with 300 us.
TEAM_SPIN_NS = 1_000_000


class TeamCell(ctypes.Structure):
    """A team run's shared state (plait/codegen/c.py TEAM_SYNC's plait_team_cell): the shared buffer and its size
    in floats, how long a barrier's waiters spin before they sleep (ns), the lock that grows the buffer, and the
    barrier's arrival count, generation and sleeper count, and where the team's threads run (set per call by
    plait_run_team; plait_team_spread reads it)."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("cap", ctypes.c_size_t),
        ("spin", ctypes.c_long),
        ("lock", ctypes.c_int),
        ("count", ctypes.c_int),
        ("gen", ctypes.c_int),
        ("sleepers", ctypes.c_int),
        ("place", ctypes.c_void_p),
    ]


class TeamRun:
    """Kernels run as the steps of one parallel region (plait_run_team), their argument arrays built once: each
    step's buffers, then the run's TeamCell, whose shared buffer is freed with the run. `sync[i]` says whether step
    i waits for the steps before it (team_barriers). The region has PLAIT_NUM_THREADS threads when that is set,
    whatever OpenMP was told before plait was imported (torch loads the same libgomp and may read OMP_NUM_THREADS
    first), else OpenMP's own count."""

    def __init__(self, lib: ctypes.CDLL, steps: list[Any]):
        self.cell = TeamCell(spin=TEAM_SPIN_NS)
        cell = ctypes.addressof(self.cell)
        self.args = [
            (ctypes.c_void_p * (len(s.buffers) + 1))(*(x.handle.ctypes.data for x in s.buffers), cell) for s in steps
        ]
        self.fns = (ctypes.c_void_p * len(steps))(*(s.program.team for s in steps))
        self.table = (ctypes.c_void_p * len(steps))(*(ctypes.addressof(a) for a in self.args))
        self.sync = (ctypes.c_ubyte * len(steps))(*team_barriers(steps))
        self.call = functools.partial(
            lib.plait_run_team,
            settings.get("PLAIT_NUM_THREADS"),
            settings.get("PLAIT_PIN_THREADS"),
            len(steps),
            self.fns,
            self.table,
            self.sync,
            ctypes.byref(self.cell),
        )
        weakref.finalize(self, lib.plait_team_release, ctypes.byref(self.cell))

    @property
    def shared_bytes(self) -> int:
        """Bytes the run's shared buffer holds (it grows on a run's first use to the largest request)."""
        return int(self.cell.cap) * 4

    def __call__(self) -> None:
        self.call()


def team_barriers(steps: list[Any]) -> list[int]:
    """1 for each step of a team run that must wait for every step before it, else 0: a step that reads memory a
    step since the last barrier writes, or writes memory one of them reads or writes, or that uses the run's cell
    while one of them does. Steps (with .program, .kernel, .buffers, output first) that do not depend on each other
    (two reductions of one input, say) run back to back without one; the GEMMs that use the cell for a shared
    packing always wait, whether or not this call of theirs splits its rows."""
    flags: list[int] = []
    reads: list[tuple[int, int]] = []
    writes: list[tuple[int, int]] = []
    cell = False
    for step in steps:
        spans = [(b.handle.ctypes.data, b.handle.ctypes.data + b.nbytes) for b in step.buffers]
        out = _written(step.kernel, len(spans))
        w = [sp for i, sp in enumerate(spans) if i in out]
        r = [sp for i, sp in enumerate(spans) if i not in out]
        uses_cell = step.program.cell
        wait = bool(flags) and (_overlap(w, writes + reads) or _overlap(r, writes) or (uses_cell and cell))
        if wait:
            reads, writes, cell = [], [], False
        flags.append(int(wait))
        reads += r
        writes += w
        cell = cell or uses_cell
    return flags


def _written(kernel: Any, count: int) -> set[int]:
    """Indices of the buffer arguments kernel may write: its leading `writes` and any pointer parameter of its C
    entry not declared const (every argument when the signature cannot be read)."""
    found = re.search(rf"\bvoid {re.escape(kernel.name)}\(([^)]*)\)", kernel.source)
    params = [p.strip() for p in found.group(1).split(",")] if found else []
    if len(params) != count:
        return set(range(count))
    return set(range(kernel.writes)) | {i for i, p in enumerate(params) if not p.startswith("const")}


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)
