"""The `opencl` device: pyopencl over any OpenCL 1.2+ platform, one in-order queue, binaries cached on disk.

Discovery probes every device by building and running a tiny kernel; a platform that lists devices but cannot
build (e.g. a PoCL without support for this CPU) is reported unusable with the reason instead of breaking plait.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any

import numpy as np

from plait.codegen.opencl import OpenCLRenderer
from plait.errors import CompileError, DeviceError
from plait.runtime import cache, opencl_build
from plait.runtime.base import Allocator, Buffer, Device, DeviceInfo, Program, build_each, build_parallel, join_sources

if "OCL_ICD_VENDORS" not in os.environ and os.path.isdir("/etc/OpenCL/vendors"):
    os.environ["OCL_ICD_VENDORS"] = "/etc/OpenCL/vendors"

_PROBE = "__kernel void probe(__global float* x) { x[get_global_id(0)] = 2.0f * get_global_id(0); }"


def _cl() -> Any:
    try:
        import pyopencl as cl
    except ImportError as e:  # pragma: no cover - pyopencl is a core dependency
        raise DeviceError("opencl: pyopencl is not installed; pip install pyopencl") from e
    return cl


@functools.cache
def discover() -> list[tuple[str, Any, str | None]]:
    """Every OpenCL device as (plait name, cl.Device or None, reason it is unusable or None)."""
    cl = _cl()
    out: list[tuple[str, Any, str | None]] = []
    try:
        platforms = cl.get_platforms()
    except cl.Error as e:
        return [("opencl", None, f"no OpenCL platform ({e}); on Debian: apt install pocl-opencl-icd")]
    i = 0
    for plat in platforms:
        try:
            devs = plat.get_devices()
        except cl.Error as e:
            out.append((f"opencl (platform {plat.name})", None, f"listing devices failed: {e}"))
            continue
        for dev in devs:
            out.append((f"opencl:{i}", dev, _probe(cl, dev)))
            i += 1
    return out


def _probe(cl: Any, dev: Any) -> str | None:
    try:
        ctx = cl.Context([dev])
        queue = cl.CommandQueue(ctx)
        prog = cl.Program(ctx, _PROBE).build()
        buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 16 * 4)
        prog.probe(queue, (16,), None, buf)
        host = np.empty(16, np.float32)
        cl.enqueue_copy(queue, host, buf)
        queue.finish()
        if not np.array_equal(host, 2.0 * np.arange(16, dtype=np.float32)):
            return "probe kernel computed wrong values"
    except Exception as e:
        msg = " ".join(str(e).split())
        return f"cannot build or run a kernel ({dev.platform.name} {dev.platform.version}): {msg[:300]}"
    return None


class CLAllocator(Allocator):
    def __init__(self, device: OpenCLDevice):
        self.device = device
        self.pool: dict[int, list[Any]] = {}

    def alloc(self, nbytes: int) -> Buffer:
        free = self.pool.get(nbytes)
        if free:
            self.taken(nbytes)
            return Buffer(self.device, nbytes, free.pop())
        cl = _cl()
        for attempt in range(2):
            try:
                handle = cl.Buffer(self.device.ctx, cl.mem_flags.READ_WRITE, max(nbytes, 4))
                break
            except cl.Error as e:
                if attempt == 0 and self.release_cached():
                    continue  # blocks cached for reuse held the memory: try again without them
                raise DeviceError(
                    f"{self.device.name}: cannot allocate {nbytes} bytes ({e}); use a smaller batch"
                ) from e
        self.taken(nbytes)
        return Buffer(self.device, nbytes, handle)

    def release_cached(self) -> int:
        released = 0
        for size, handles in self.pool.items():
            for h in handles:
                h.release()
                released += size
        self.pool.clear()
        return released

    def free(self, nbytes: int, handle: Any) -> None:
        self.in_use -= nbytes
        self.pool.setdefault(nbytes, []).append(handle)

    def copy_in(self, buf: Buffer, src: np.ndarray) -> None:
        if buf.nbytes:
            _cl().enqueue_copy(self.device.queue, buf.handle, np.ascontiguousarray(src), is_blocking=True)

    def copy_out(self, buf: Buffer, dst: np.ndarray) -> None:
        if buf.nbytes:
            _cl().enqueue_copy(self.device.queue, dst, buf.handle, is_blocking=True)

    def copy(self, dst: Buffer, src: Buffer) -> None:
        if src.nbytes:
            _cl().enqueue_copy(self.device.queue, dst.handle, src.handle, byte_count=src.nbytes)


class CLProgram(Program):
    def __init__(self, device: OpenCLDevice, kernel: Any):
        self.device = device
        self.kernel = kernel

    def bind(self, buffers: list[Buffer], global_size: tuple[int, ...], local_size: tuple[int, ...] | None) -> Any:
        cl = _cl()
        k = self.kernel.clone() if hasattr(self.kernel, "clone") else self.kernel
        k.set_args(*(b.handle for b in buffers))
        queue = self.device.queue
        return functools.partial(cl.enqueue_nd_range_kernel, queue, k, global_size, local_size)


class OpenCLDevice(Device):
    def __init__(self, name: str = "opencl"):
        cl = _cl()
        found = discover()
        usable = [(n, d) for n, d, why in found if why is None]
        if name == "opencl":
            if not usable:
                reasons = "; ".join(f"{n}: {why}" for n, _, why in found)
                raise DeviceError(f"no usable OpenCL device ({reasons}); use device='cpu' or install a driver")
            gpus = [(n, d) for n, d in usable if d.type & cl.device_type.GPU]
            name, dev = (gpus or usable)[0]
        else:
            match = [(n, d, why) for n, d, why in found if n == name]
            if not match:
                raise DeviceError(f"unknown device {name!r}; `plait devices` lists {[n for n, _, _ in found]}")
            if match[0][2]:
                raise DeviceError(f"{name} is present but unusable: {match[0][2]}")
            dev = match[0][1]
        self.name = name
        self.dev = dev
        self.ctx = cl.Context([dev])
        self.queue = cl.CommandQueue(self.ctx)
        self.launch_errors = (cl.Error,)
        self.renderer = OpenCLRenderer()
        self.allocator = CLAllocator(self)
        self._programs: dict[str, CLProgram] = {}
        self._profiling_queue: Any = None  # made on the first kernel report
        self.info = DeviceInfo(
            "opencl",
            dev.name.strip(),
            dev.max_compute_units,
            dev.global_mem_size,
            driver=f"{dev.platform.name.strip()} {dev.driver_version}",
            extra={
                "platform": dev.platform.version,
                "local_mem": dev.local_mem_size,
                "gpu": bool(dev.type & cl.device_type.GPU),
            },
        )

    def compile(self, source: str, kernel_name: str) -> Program:
        key = self._key(source)
        prog = self._programs.get(key)
        if prog is None:
            prog = self._programs[key] = CLProgram(self, getattr(self._build(key, source), kernel_name))
        return prog

    def compile_batch(self, kernels: list[tuple[str, str]]) -> list[Program]:
        """A plan's kernels built in parallel. On NVIDIA (its JIT cache on) and with enough kernels not in the disk
        cache, worker processes build them (opencl_build: a process's builds are largely serialised by the
        driver); elsewhere one OpenCL program per host core, built from parallel threads: a few driver builds
        instead of one per kernel, and not one long serial one."""
        todo = [(src, name) for src, name in kernels if self._key(src) not in self._programs]
        todo = list(dict((name, (src, name)) for src, name in todo).values())  # a kernel used twice is built once
        if opencl_build.workers_help(self.dev):
            # kernels in the disk cache load from it below (their machine code is in the driver's JIT cache)
            todo = [(src, name) for src, name in todo if cache.get("opencl", self._key(src)) is None]
            if len(todo) >= opencl_build.MIN_KERNELS:
                built = opencl_build.build_binaries(self.dev, [src for src, _ in todo])
                for i, binary in built.items():
                    cache.put("opencl", self._key(todo[i][0]), binary)
                todo = []  # compile() below loads each binary; one a worker could not build is built there
        if len(todo) > 1:
            with warnings.catch_warnings():  # the threads' own catch_warnings interleave: hold the filter for all
                warnings.simplefilter("ignore", _cl().CompilerWarning)
                build_parallel(self._build_group, todo)
        return [self.compile(src, name) for src, name in kernels]

    def expect_builds(self, rendered: list[str], total: int) -> None:
        """Start the build workers compile_batch will use (opencl_build.prestart) while the plan renders the rest of
        its kernels, when the first rendered ones say most of the plan will be built: each worker's start (Python,
        pyopencl, a device context) then overlaps rendering instead of preceding the builds."""
        if not opencl_build.workers_help(self.dev) or total < opencl_build.MIN_KERNELS:
            return
        missing = sum(
            self._key(src) not in self._programs and cache.get("opencl", self._key(src)) is None for src in rendered
        )
        if 2 * missing > len(rendered):
            opencl_build.prestart(self.dev, -(-total * missing // len(rendered)))

    def _key(self, source: str) -> str:
        return cache.key_of("opencl", self.info.name, self.info.driver, source)

    def _build_group(self, group: list[tuple[str, str]]) -> None:
        if len(group) < 2:
            build_each(self, group)  # a lone kernel builds under its own key, still in this thread
            return
        joined = join_sources(group)
        try:
            prog = self._build(cache.key_of("opencl-batch", self.info.name, self.info.driver, joined), joined)
        except CompileError:
            build_each(self, group)
            return
        for src, name in group:
            self._programs[self._key(src)] = CLProgram(self, getattr(prog, name))

    def _build(self, key: str, source: str) -> Any:
        cl = _cl()
        binary = cache.get("opencl", key)
        with warnings.catch_warnings():
            # drivers print informational build logs; real failures raise and carry the log in the error
            warnings.simplefilter("ignore", cl.CompilerWarning)
            if binary is not None:
                try:
                    return cl.Program(self.ctx, [self.dev], [binary]).build()
                except cl.Error:
                    pass  # stale or foreign binary: rebuild from source below
            try:
                prog = cl.Program(self.ctx, source).build()
            except cl.Error as e:
                log = str(e)[-4000:]
                raise CompileError(
                    f"{self.name}: the OpenCL compiler rejected a kernel:\n{log}\n--- source ---\n{source[:4000]}"
                ) from e
        bins = prog.get_info(cl.program_info.BINARIES)
        if bins and bins[0]:
            cache.put("opencl", key, bytes(bins[0]))
        return prog

    def synchronize(self) -> None:
        self.queue.finish()

    def time_launch(self, launch: Any) -> float:
        """The kernel's own run time from OpenCL profiling events: the launch (a partial of enqueue_nd_range_kernel
        made by CLProgram.bind) is enqueued again on a profiling-enabled queue once the main queue has drained."""
        cl = _cl()
        if self._profiling_queue is None:
            props = cl.command_queue_properties.PROFILING_ENABLE
            self._profiling_queue = cl.CommandQueue(self.ctx, properties=props)
        self.queue.finish()
        _queue, kernel, global_size, local_size = launch.args
        event = cl.enqueue_nd_range_kernel(self._profiling_queue, kernel, global_size, local_size)
        event.wait()
        return float(event.profile.end - event.profile.start) * 1e-9
