"""The interface every device kind implements: Device, Buffer + Allocator, Compiler, Program.

A runtime module (cpu.py, opencl.py) subclasses these and is listed in plait.runtime.REGISTRY.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plait.errors import CompileError


@dataclass
class Buffer:
    """Device memory of `nbytes`; `handle` is what kernels receive (a pointer, a cl.Buffer...)."""

    device: Device
    nbytes: int
    handle: Any
    managed: bool = False  # returned to the allocator's pool when this object dies


class Allocator:
    """alloc/free/copy_in/copy_out; implementations may cache freed blocks by size."""

    in_use = 0  # bytes held by live buffers (cached free blocks not counted)
    peak = 0  # the most `in_use` has been since reset_peak(): the memory a workload needs

    def taken(self, nbytes: int) -> None:
        """Count a buffer handed out (implementations call this from alloc)."""
        self.in_use += nbytes
        self.peak = max(self.peak, self.in_use)

    def reset_peak(self) -> None:
        """Start measuring `peak` afresh from what is in use now."""
        self.peak = self.in_use

    def alloc(self, nbytes: int) -> Buffer:
        raise NotImplementedError

    def free(self, nbytes: int, handle: Any) -> None:
        """Return memory to the allocator (called when the last Buffer object holding `handle` dies)."""
        raise NotImplementedError

    def copy_in(self, buf: Buffer, src: np.ndarray) -> None:
        raise NotImplementedError

    def copy_out(self, buf: Buffer, dst: np.ndarray) -> None:
        raise NotImplementedError

    def host_view(self, buf: Buffer, shape: tuple[int, ...], dtype: Any) -> np.ndarray | None:
        """`buf`'s memory as an array of `shape` and `dtype` that the host reads and writes directly (a plan's calls
        copy inputs and outputs through it with no further Python), or None where device memory is not host memory
        (copy_in and copy_out then do the work)."""
        return None

    def release_cached(self) -> int:
        """Give the freed blocks this allocator keeps for reuse back to the device; returns the bytes released."""
        pool: dict[int, list[Any]] = getattr(self, "pool", {})
        released = sum(size * len(blocks) for size, blocks in pool.items())
        pool.clear()
        return released

    def copy(self, dst: Buffer, src: Buffer) -> None:
        """Copy `src`'s bytes into `dst` (same size) in queue order; this default goes through host memory."""
        host = np.empty(src.nbytes, np.uint8)
        self.copy_out(src, host)
        self.copy_in(dst, host)


_SHARED = re.compile(r"//@shared-begin (\S+)\n.*?//@shared-end\n", re.S)


def join_sources(kernels: list[tuple[str, str]]) -> str:
    """One translation unit from several kernel sources. A block between `//@shared-begin ID` and `//@shared-end`
    (library code such as the generic GEMM) and the text before each kernel's declaration (includes, helper
    functions) are kept only the first time they appear, so shared code is compiled and defined once."""
    seen: set[str] = set()
    blocks: set[str] = set()
    parts: list[str] = []

    def keep_first(match: re.Match[str]) -> str:
        if match.group(1) in blocks:
            return ""
        blocks.add(match.group(1))
        return match.group(0)

    for src, name in kernels:
        src = _SHARED.sub(keep_first, src)
        found = re.search(rf"void {re.escape(name)}(_run)?\(", src)  # a C kernel's body function comes first
        cut = found.start() if found else -1
        cut = src.rfind("\n", 0, cut) + 1 if cut > 0 else 0
        head, body = src[:cut], src[cut:]
        if head and head in seen:
            head = ""
        seen.add(head)
        parts.append(head + body)
    return "\n".join(parts)


def split_batch(kernels: list[tuple[str, str]], parts: int) -> list[list[tuple[str, str]]]:
    """Deal (source, name) pairs into at most `parts` groups of about equal source length (largest first, each to
    the lightest group), so a plan's kernels build as several compiler runs in parallel. Deterministic: the same
    kernels give the same groups, hence the same cache keys."""
    groups: list[list[tuple[str, str]]] = [[] for _ in range(max(1, min(parts, len(kernels))))]
    sizes = [0] * len(groups)
    for src, name in sorted(kernels, key=lambda k: (-len(k[0]), k[1])):
        i = sizes.index(min(sizes))
        groups[i].append((src, name))
        sizes[i] += len(src)
    return groups


def build_parallel(build: Callable[[list[tuple[str, str]]], None], kernels: list[tuple[str, str]]) -> None:
    """Run `build` on groups of `kernels` (split_batch), one thread per core: compilers run outside the GIL."""
    groups = split_batch(kernels, os.cpu_count() or 1)
    if len(groups) == 1:
        build(groups[0])
        return
    with ThreadPoolExecutor(len(groups)) as pool:
        list(pool.map(build, groups))


def build_each(device: Device, group: list[tuple[str, str]]) -> None:
    """Build a group's kernels one by one in the group's thread (a lone kernel, or after the group's joint build
    failed). A kernel that fails is left for the caller's own compile() to raise, so the error names it."""
    for src, name in group:
        try:
            device.compile(src, name)
        except CompileError:
            continue


class Program:
    """A compiled kernel. `bind` presets its arguments and returns a cheap zero-argument launcher for replay."""

    def bind(self, buffers: list[Buffer], global_size: tuple[int, ...], local_size: tuple[int, ...] | None) -> Any:
        raise NotImplementedError


@dataclass
class DeviceInfo:
    kind: str
    name: str
    compute_units: int
    memory_bytes: int
    driver: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Device:
    """One usable device. `name` is the plait device string ('cpu', 'opencl:0')."""

    name: str
    info: DeviceInfo
    allocator: Allocator
    renderer: Any

    def compile(self, source: str, kernel_name: str) -> Program:
        raise NotImplementedError

    def compile_batch(self, kernels: list[tuple[str, str]]) -> list[Program]:
        """Compile several (source, kernel name) pairs; devices override this to build them in one compiler call."""
        return [self.compile(src, name) for src, name in kernels]

    def expect_builds(self, rendered: list[str], total: int) -> None:
        """A plan has rendered the kernel sources `rendered` of `total` it will build: a device whose builds start
        slowly may start getting ready while the rest render. Here nothing."""

    def synchronize(self) -> None:
        raise NotImplementedError

    def chain(self, launches: list[Any]) -> list[Any]:
        """Zero-argument callables that run `launches` (each with .program, .kernel and .buffers, output first) in
        order when called in turn: here one per launch; a device that runs several kernels in one call overrides it."""
        return [la.program.bind(la.buffers, la.kernel.global_size, la.kernel.local_size) for la in launches]

    # exceptions a kernel launch may raise that mean the device failed (out of memory, say), not a plait bug
    launch_errors: tuple[type[BaseException], ...] = ()

    def launch_failure(self, error: BaseException) -> Exception:
        """The PlaitError to raise for a failed launch: what failed and what to do about it."""
        from plait.errors import DeviceError

        self.allocator.release_cached()
        what = " ".join(str(error).split())
        hint = (
            "the device is out of memory: use a smaller batch, or drop models, plans and tensors you no longer need"
            if "ALLOCATION" in what.upper() or "OUT_OF" in what.upper()
            else "the device or its driver failed; try device='cpu' to check the model"
        )
        return DeviceError(f"{self.name}: a kernel launch failed ({what[:300]}); {hint}")

    def time_launch(self, launch: Any) -> float:
        """Seconds one bound launch takes on its own (kernel reports): host clocks around it, after the queue drains;
        devices with their own event timers override this."""
        self.synchronize()
        t0 = time.perf_counter()
        launch()
        self.synchronize()
        return time.perf_counter() - t0
