"""The C dialect: one function per kernel, parallelised with OpenMP, vectorised by the compiler.

A kernel's loops share work through orphaned worksharing constructs (`#pragma omp for ... nowait`, no `parallel`
of their own), so the same body runs either on its own or as one step of a team that is already running: a replayed
plan runs all its kernels inside one parallel region (plait/runtime/cpu.py), so the threads wake once per replay
instead of once per kernel. `entry_points` writes the two ways in.
"""

from __future__ import annotations

import re

from plait.codegen.cstyle import CStyleRenderer
from plait.dtypes import DType

_MATH = ("exp", "log", "sqrt", "fabs", "tanh", "sin", "cos", "erf", "floor", "ceil", "pow", "fmod")
TEAM_SUFFIX = "_team"  # the symbol of a kernel's entry as one step of a running team
# A team run's barrier (a counter and a generation in the run's cell; the runner in plait/runtime/cpu_team.py and the
# kernels' own barriers share it): the last thread to arrive bumps the generation; the others spin on it for the
# cell's `spin` nanoseconds, yielding the core between bursts of pauses, then sleep on a futex (off Linux they keep
# spinning and yielding). A spin covers the usual gap between two threads finishing their shares of a kernel without
# a sleep and a wake-up on the critical path; threads idle between replays still sleep (OMP_WAIT_POLICY=PASSIVE).
TEAM_SYNC = """//@shared-begin plait_team_sync
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <omp.h>
#define PLAIT_TEAM_WHERE 16
/* Where a process's team threads run (one, in the team runner's library: libgomp's pool threads serve every team
   run): where[t] the CPU of thread t (the caller's at the latest call, a worker's pinned CPU), tids[t] a worker's
   thread id, and the CPUs the process may use. */
typedef struct {
  int where[PLAIT_TEAM_WHERE], tids[PLAIT_TEAM_WHERE];
  unsigned long mask[16];
  long bytes, allowed;
} plait_team_place;
typedef struct {
  float* buf;
  size_t cap;
  long spin;
  int lock, count, gen, sleepers;
  plait_team_place* place; /* 0: threads are not placed (one thread, PLAIT_PIN_THREADS=0, more threads than CPUs) */
} plait_team_cell;
static inline void plait_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}
static long plait_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
/* Whether a thread other than t (of the first `upto`) runs on `cpu`. */
static int plait_team_held(const plait_team_place* p, int t, int upto, int cpu) {
  for (int j = 0; j < upto; j++)
    if (j != t && __atomic_load_n(&p->where[j], __ATOMIC_RELAXED) == cpu) return 1;
  return 0;
}
/* An allowed CPU after `from` that no thread other than t holds, or -1. */
static int plait_team_free_cpu(const plait_team_place* p, int t, int upto, unsigned from) {
  for (long k = 1; k <= p->bytes * 8; k++) {
    int cand = (int)((from + k) % (p->bytes * 8));
    if (p->mask[cand / 64] >> (cand % 64) & 1 && !plait_team_held(p, t, upto, cand)) return cand;
  }
  return -1;
}
static int plait_team_pin(int tid, int cpu) {
#ifdef __linux__
  unsigned long one[16] = {0};
  one[cpu / 64] = 1UL << (cpu % 64);
  return (int)syscall(SYS_sched_setaffinity, tid, sizeof one, one);
#else
  return -1;
#endif
}
/* A thread woken from a barrier's futex that finds itself on a teammate's CPU (see plait/runtime/cpu_team.py
   TEAM_RUNNER) moves to an allowed CPU none of them holds: a worker stays pinned there, the calling thread gets the
   process's mask back. */
static void plait_team_spread(plait_team_cell* c, int t, int upto) {
#ifdef __linux__
  plait_team_place* p = c->place;
  unsigned cpu = 0;
  if (!p || t >= PLAIT_TEAM_WHERE || syscall(SYS_getcpu, &cpu, 0, 0)) return;
  if (upto > PLAIT_TEAM_WHERE) upto = PLAIT_TEAM_WHERE;
  if (!plait_team_held(p, t, upto, (int)cpu)) return;
  int cand = plait_team_free_cpu(p, t, upto, cpu);
  if (cand < 0 || plait_team_pin(0, cand)) return;
  if (t == 0) syscall(SYS_sched_setaffinity, 0, sizeof p->mask, p->mask);
  __atomic_store_n(&p->where[t], cand, __ATOMIC_RELAXED);
#endif
}
static void plait_team_sync(plait_team_cell* c, int threads) {
  if (threads < 2) return;
  int gen = __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&c->count, 1, __ATOMIC_ACQ_REL) == threads) {
    __atomic_store_n(&c->count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&c->gen, gen + 1, __ATOMIC_SEQ_CST);
#ifdef __linux__
    if (__atomic_load_n(&c->sleepers, __ATOMIC_SEQ_CST)) syscall(SYS_futex, &c->gen, FUTEX_WAKE_PRIVATE, INT_MAX, 0, 0, 0);
#endif
    return;
  }
  long until = plait_now_ns() + c->spin;
  for (int i = 1;; i++) {
    if (__atomic_load_n(&c->gen, __ATOMIC_ACQUIRE) != gen) return;
    plait_pause();
    if (i % 64) continue;
    long now = plait_now_ns();
    if (now > until) break;
    sched_yield();
    /* The yield ran another thread (or the host took the vCPU): the core is wanted elsewhere, so sleep now rather
       than spin on; on a quiet core sched_yield returns within a microsecond or two. */
    if (plait_now_ns() - now > 20000) break;
  }
#ifdef __linux__
  __atomic_add_fetch(&c->sleepers, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&c->gen, __ATOMIC_SEQ_CST) == gen) syscall(SYS_futex, &c->gen, FUTEX_WAIT_PRIVATE, gen, 0, 0, 0);
  __atomic_sub_fetch(&c->sleepers, 1, __ATOMIC_SEQ_CST);
  plait_team_spread(c, omp_get_thread_num(), threads);
#else
  while (__atomic_load_n(&c->gen, __ATOMIC_ACQUIRE) == gen) sched_yield();
#endif
}
//@shared-end
"""
# The buffer a team run's threads share (the C GEMM's packed B, Winograd's input tiles): one per team run, passed
# to every step as the argument after the kernel's own, grown to the largest request. Every thread of a step gets the
# same pointer with no barrier (steps that use it are separated by the runner's barriers, so growing it never frees
# memory in use); plait_team_shared returns 0 to a kernel run alone, which hands one thread's buffer to its team
# instead. plait_team_barrier is a kernel's own barrier: the team's in a team step, OpenMP's when run alone.
TEAM_CELL = """//@shared-begin plait_team_cell
static __thread plait_team_cell* plait_team_now;
static float* plait_team_shared(size_t n) {
  plait_team_cell* c = plait_team_now;
  if (!c) return 0;
  if (__atomic_load_n(&c->cap, __ATOMIC_ACQUIRE) >= n) return c->buf;
  while (__atomic_exchange_n(&c->lock, 1, __ATOMIC_ACQUIRE)) sched_yield();
  if (c->cap < n) {
    free(c->buf);
    c->buf = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    __atomic_store_n(&c->cap, n, __ATOMIC_RELEASE);
  }
  __atomic_store_n(&c->lock, 0, __ATOMIC_RELEASE);
  return c->buf;
}
static void plait_team_barrier(void) {
  if (plait_team_now) {
    plait_team_sync(plait_team_now, omp_get_num_threads());
    return;
  }
#pragma omp barrier
}
//@shared-end
"""


def uses_team_cell(source: str) -> bool:
    """Whether a kernel's team entry takes the run's cell (its shared buffer, its barrier): two such kernels in one
    team run are always separated by a barrier, since the second may grow (free) the buffer the first still reads."""
    return "//@shared-begin plait_team_cell" in source


def entry_points(name: str, params: list[str], body: str, library: str = "") -> str:
    """The C functions of kernel `name` with parameters `params` (declarations, pointers) and `body` (statements),
    after `library` (the shared code it calls): `name_run` holds the body; `name(...)` runs it on its own, inside a
    parallel region of its own when the source shares work (`#pragma omp for`), else serially; `name_team(args)` runs
    it as one step of a team already running (plait_run_team), every thread passing the same argument array (the
    kernel's arguments, then the team's TEAM_CELL). No
    entry ends with a barrier of its own: a lone call ends with its region, a team step is followed by the runner's
    barrier, so a kernel's last worksharing loop is `nowait`. A source that opens its own parallel regions (custom
    kernels written with `#pragma omp parallel for`) keeps the one plain function and runs as a launch of its own."""
    source = library + body
    if "#pragma omp parallel" in source:
        return f"{library}void {name}({', '.join(params)}) {{\n{body}}}\n"
    # worksharing: OpenMP's loops, or a task loop with stealing (gemm_c.steal_loop), which every thread must run too
    shared = "#pragma omp for" in source or "plait_steal_start(&" in source
    names = [re.findall(r"\w+", p)[-1] for p in params]
    args = ", ".join(f"a[{i}]" for i in range(len(params)))
    alone, step = ("#pragma omp parallel\n", "") if shared else ("", "#pragma omp single nowait\n")
    cell = "plait_team_shared(" in library or "plait_team_barrier(" in library  # library code uses the team's cell
    enter, leave = (f"  plait_team_now = a[{len(params)}];\n", "  plait_team_now = 0;\n") if cell else ("", "")
    return (
        f"{TEAM_SYNC + TEAM_CELL if cell else ''}{library}"
        f"static __attribute__((noinline)) void {name}_run({', '.join(params)}) {{\n{body}}}\n"
        f"void {name}({', '.join(params)}) {{\n{alone}  {name}_run({', '.join(names)});\n}}\n"
        f"void {name}{TEAM_SUFFIX}(void* const* a) {{\n{enter}{step}  {name}_run({args});\n{leave}}}\n"
    )


class CRenderer(CStyleRenderer):
    dialect = "c"
    storage_types = {
        "float32": "float",
        "float16": "_Float16",
        "int32": "int",
        "int64": "long",
        "bool": "unsigned char",
    }
    fn_names = {f: f + "f" for f in _MATH}
    preamble = "#include <math.h>\n"
    parallel_threshold = 1 << 15  # below this much work, a parallel region costs more than it saves
    implicit_conv = True  # the C GEMM gathers convolution patches while packing (no im2col buffer)
    row_loops = True

    def round_half(self, v: str) -> str:
        return f"(float)(_Float16)({v})"

    def param(self, dt: DType, name: str, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"{const}{self.storage_type(dt)}* restrict {name}"

    def declare(self, name: str, params: list[str]) -> str:
        return f"void {name}({', '.join(params)})"

    def function(self, name: str, params: list[str], body: str) -> str:
        return entry_points(name, params, body + "\n")

    def parallel_for(
        self, var: str, n: int, body: list[str], idx_t: str, work: int, simd_ok: bool = False
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        simd = " simd" if simd_ok else ""
        if work >= self.parallel_threshold and n > 1:
            pragma = [f"#pragma omp for{simd} schedule(static) nowait"]
        else:
            pragma = ["#pragma omp simd"] if simd else []
        return (
            [*pragma, f"for ({idx_t} {var} = 0; {var} < {n}; {var}++) {{", *("  " + ln for ln in body), "}"],
            (n,),
            None,
        )

    def parallel_rows(
        self, rows: int, width: int, head: list[str], body: list[str], idx_t: str, work: int, simd_ok: bool
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        outer = ["#pragma omp for schedule(static) nowait"] if work >= self.parallel_threshold and rows > 1 else []
        inner = ["#pragma omp simd"] if simd_ok else []
        lines = [
            *outer,
            f"for ({idx_t} o = 0; o < {rows}; o++) {{",
            *("  " + ln for ln in head),
            *("  " + ln for ln in inner),
            f"  for ({idx_t} j = 0; j < {width}; j++) {{",
            *("    " + ln for ln in body),
            "  }",
            "}",
        ]
        return lines, (rows * width,), None

    def reduce_loop(
        self,
        var: str,
        lo: str,
        hi: str,
        step: str,
        body: list[str],
        idx_t: str,
        acc: str,
        op: str,
        nan_flag: bool = False,
    ) -> list[str]:
        simd = {"sum": "+", "prod": "*", "max": "max", "min": "min"}.get(op)
        flag = " reduction(|:nanf)" if nan_flag else ""
        pragma = [f"#pragma omp simd reduction({simd}:{acc}){flag}"] if simd else []
        return [*pragma, *super().reduce_loop(var, lo, hi, step, body, idx_t, acc, op, nan_flag)]
