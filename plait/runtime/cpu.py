"""The `cpu` device: kernels rendered as C, built by the system compiler (-O3, native SIMD, OpenMP) and loaded
through ctypes. Buffers are 64-byte-aligned host memory; launches are plain function calls with preset pointers.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from plait import settings
from plait.codegen import simd
from plait.codegen.c import TEAM_SUFFIX, CRenderer, uses_team_cell
from plait.errors import CompileError, DeviceError
from plait.runtime import cache
from plait.runtime.base import Allocator, Buffer, Device, DeviceInfo, Program, build_each, build_parallel, join_sources
from plait.runtime.cpu_team import TEAM_RUNNER, TeamRun

# Idle OpenMP threads must sleep, not spin: on a loaded 2-core machine spinning threads starve real work.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
if settings.get("PLAIT_NUM_THREADS"):
    os.environ.setdefault("OMP_NUM_THREADS", str(settings.get("PLAIT_NUM_THREADS")))

# -fno-math-errno plus glibc's __FAST_MATH__ declarations let loops call libmvec's vector exp/tanh/...; unlike
# -ffast-math this keeps IEEE semantics for inf and NaN, which reductions and padding rely on.
FLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=gnu11",
    "-ffp-contract=fast",
    "-fno-math-errno",
    "-D__FAST_MATH__",
]
LIBS = ["-lmvec", "-lm"]


def find_compiler() -> str:
    path = simd.c_compiler()
    if path:
        return path
    raise DeviceError("cpu: no C compiler found (tried cc, gcc, clang); install gcc or set PLAIT_CC")


# Inputs of at least this many bytes (a batch of images) are copied into a plan by the team's threads
# (plait_copy_team), not by numpy on one thread.
COPY_TEAM_BYTES = 1 << 20


class CPUAllocator(Allocator):
    def __init__(self, device: CPUDevice):
        self.device = device
        self.pool: dict[int, list[np.ndarray]] = {}

    def alloc(self, nbytes: int) -> Buffer:
        free = self.pool.get(nbytes)
        if free:
            arr = free.pop()
        else:
            raw = np.empty(max(nbytes, 1) + 64, dtype=np.uint8)
            start = (-raw.ctypes.data) % 64
            arr = raw[start : start + max(nbytes, 1)]
        self.taken(nbytes)
        return Buffer(self.device, nbytes, arr)

    def free(self, nbytes: int, handle: Any) -> None:
        self.in_use -= nbytes
        self.pool.setdefault(nbytes, []).append(handle)

    def copy_in(self, buf: Buffer, src: np.ndarray) -> None:
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        if buf.nbytes >= COPY_TEAM_BYTES and data.nbytes == buf.nbytes:
            lib = self.device._team_lib()
            lib.plait_copy_team(
                settings.get("PLAIT_NUM_THREADS") or 0, buf.handle.ctypes.data, data.ctypes.data, data.nbytes
            )
            return
        buf.handle[: buf.nbytes] = data

    def copy_out(self, buf: Buffer, dst: np.ndarray) -> None:
        dst.reshape(-1).view(np.uint8)[:] = buf.handle[: buf.nbytes]

    def host_view(self, buf: Buffer, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
        if buf.nbytes >= COPY_TEAM_BYTES:
            return None  # large inputs are copied by the team's threads (copy_in)
        return buf.handle[: buf.nbytes].view(dtype).reshape(shape)

    def copy(self, dst: Buffer, src: Buffer) -> None:
        dst.handle[: dst.nbytes] = src.handle[: src.nbytes]


class CPUProgram(Program):
    """A kernel's entry on its own (`fn`), and the address of its entry as a step of a running team (`team`; None
    for a kernel that opens its own parallel regions and so must run alone)."""

    def __init__(self, fn: Any, team: int | None = None, cell: bool = False):
        self.fn = fn
        self.team = team
        self.cell = cell  # the team entry takes the run's cell (shared buffer, kernel-internal barriers)

    def bind(self, buffers: list[Buffer], global_size: tuple[int, ...], local_size: tuple[int, ...] | None) -> Any:
        return functools.partial(self.fn, *(ctypes.c_void_p(b.handle.ctypes.data) for b in buffers))


def _program(lib: ctypes.CDLL, name: str, source: str) -> CPUProgram:
    fn = getattr(lib, name)
    fn.restype = None
    team = getattr(lib, name + TEAM_SUFFIX, None)
    return CPUProgram(
        fn, ctypes.cast(team, ctypes.c_void_p).value if team is not None else None, uses_team_cell(source)
    )


class CPUDevice(Device):
    def __init__(self, name: str = "cpu"):
        if name != "cpu":
            raise DeviceError(f"unknown cpu device {name!r}; use 'cpu'")
        self.name = name
        self.cc = find_compiler()
        self.renderer = CRenderer()
        self.allocator = CPUAllocator(self)
        self._programs: dict[str, CPUProgram] = {}
        self._team: ctypes.CDLL | None = None
        cores = os.cpu_count() or 1
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.info = DeviceInfo("cpu", _cpu_name(), cores, mem, driver=_cc_version(self.cc))

    def compile(self, source: str, kernel_name: str) -> CPUProgram:
        key = self._key(source)
        prog = self._programs.get(key)
        if prog is None:
            prog = self._programs[key] = _program(self._load(key, source), kernel_name, source)
        return prog

    def chain(self, launches: list[Any]) -> list[Any]:
        """Runs of consecutive kernels with team entries become one call each (one parallel region); a kernel that
        opens its own regions runs as a launch of its own between them."""
        out: list[Any] = []
        run: list[Any] = []
        for la in [*launches, None]:
            if la is not None and la.program.team is not None:
                run.append(la)
                continue
            if len(run) > 1:
                out.append(TeamRun(self._team_lib(), run))
            else:
                out += super().chain(run)
            run = []
            if la is not None:
                out += super().chain([la])
        return out

    def _team_lib(self) -> ctypes.CDLL:
        """The library of plait_run_team and plait_team_release (built once, then from the kernel cache)."""
        if self._team is None:
            self._team = self._load(self._key(TEAM_RUNNER), TEAM_RUNNER)
            self._team.plait_run_team.restype = None
            self._team.plait_team_release.restype = None
            self._team.plait_copy_team.restype = None
            self._team.plait_copy_team.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        return self._team

    def _key(self, source: str) -> str:
        return cache.key_of("cpu", self.info.driver, simd.target_id(), " ".join(FLAGS + LIBS), source)

    def compile_batch(self, kernels: list[tuple[str, str]]) -> list[Program]:
        """A plan's kernels as one translation unit per core, compiled in parallel: a few compiler runs instead of
        one per kernel, and not one long serial one."""
        todo = [(src, name) for src, name in kernels if self._key(src) not in self._programs]
        todo = list(dict((name, (src, name)) for src, name in todo).values())  # a kernel used twice is built once
        if len(todo) > 1:
            build_parallel(self._build_group, todo)
        return [self.compile(src, name) for src, name in kernels]

    def _build_group(self, group: list[tuple[str, str]]) -> None:
        if len(group) < 2:
            build_each(self, group)  # a lone kernel builds under its own key, still in this thread
            return
        joined = join_sources(group)
        key = cache.key_of("cpu-batch", self.info.driver, simd.target_id(), " ".join(FLAGS + LIBS), joined)
        try:
            lib = self._load(key, joined)
        except CompileError:
            build_each(self, group)
            return
        for src, name in group:
            self._programs[self._key(src)] = _program(lib, name, src)

    def _load(self, key: str, source: str) -> ctypes.CDLL:
        binary = cache.get("cpu", key)
        if binary is None:
            binary = self._build(source)
            cache.put("cpu", key, binary)
        lib_dir = cache.cache_dir() / "cpu-lib"
        lib_dir.mkdir(exist_ok=True)
        path = lib_dir / f"{key}.so"
        if not path.exists() or path.stat().st_size != len(binary):
            cache.atomic_write(path, binary)
        try:
            return ctypes.CDLL(str(path))
        except OSError:
            pass
        # The library file was damaged, or the cached binary itself does not load here (a cache folder shared with
        # another system, say): rebuild from source once; a second failure is a real problem with the toolchain.
        binary = self._build(source)
        cache.put("cpu", key, binary)
        cache.atomic_write(path, binary)
        try:
            return ctypes.CDLL(str(path))
        except OSError as e:
            raise CompileError(
                f"cpu: a freshly built kernel library does not load ({e}); check PLAIT_CC and the C toolchain"
            ) from e

    def _build(self, source: str) -> bytes:
        with tempfile.TemporaryDirectory(prefix="plait-cc-") as tmp:
            src, out = Path(tmp) / "k.c", Path(tmp) / "k.so"
            src.write_text(source)
            res = subprocess.run([self.cc, *FLAGS, str(src), "-o", str(out), *LIBS], capture_output=True, text=True)
            if res.returncode != 0:
                raise CompileError(
                    f"cpu: {self.cc} failed to build a kernel:\n{res.stderr[-4000:]}\n--- source ---\n{source[:4000]}"
                )
            return out.read_bytes()

    def synchronize(self) -> None:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


@functools.cache
def _cc_version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return cc
