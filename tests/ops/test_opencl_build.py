"""OpenCL kernels built in worker processes (plait/runtime/opencl_build.py): the binaries they send back load in
this process's context and compute what the source says; a source the compiler rejects is left for an in-process
build, whose error names the kernel."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from plait import settings
from plait.errors import CompileError
from plait.runtime import cache, get_device, opencl_build
from plait.runtime.opencl import CLProgram
from tests.conftest import DEVICES

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]


def _scale_kernel(factor: float) -> tuple[str, str]:
    """A kernel multiplying by `factor`, its name unique to this run so no cache serves it."""
    name = f"scale_{uuid.uuid4().hex[:12]}"
    src = f"__kernel void {name}(__global float* y, __global const float* x) {{ int i = get_global_id(0); y[i] = {factor}f * x[i]; }}"
    return src, name


def _run(dev: object, prog: object, x: np.ndarray) -> np.ndarray:
    alloc = dev.allocator  # type: ignore[attr-defined]
    bx, by = alloc.alloc(x.nbytes), alloc.alloc(x.nbytes)
    alloc.copy_in(bx, x)
    prog.bind([by, bx], (x.size,), None)()  # type: ignore[attr-defined]
    out = np.empty_like(x)
    alloc.copy_out(by, out)
    return out


@pytest.mark.parametrize("cl_device", CL_DEVICES)
def test_compile_batch_through_workers(cl_device: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = get_device(cl_device)
    monkeypatch.setattr(opencl_build, "workers_help", lambda _dev: True)  # as on NVIDIA with its JIT cache on
    monkeypatch.setattr(opencl_build, "MIN_KERNELS", 2)
    good = _scale_kernel(-3.5)
    bad = ("__kernel void rejected_here(__global float* y) { y[0] = undeclared; }", "rejected_here")
    x = np.linspace(-1, 1, 32, dtype=np.float32)
    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        with pytest.raises(CompileError, match="rejected_here"):  # rebuilt in this process, where the error names it
            dev.compile_batch([good, bad])
        assert cache.get("opencl", dev._key(bad[0])) is None  # type: ignore[attr-defined]
        assert cache.get("opencl", dev._key(good[0])) is not None  # type: ignore[attr-defined]  # a worker built it
        prog = dev.compile(*good)  # loads the worker's binary into this process's context
        np.testing.assert_array_equal(_run(dev, prog, x), -3.5 * x)


@pytest.mark.parametrize("cl_device", CL_DEVICES)
def test_workers_stay_between_builds(cl_device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second build soon after the first reuses its worker processes (a first call's later plans pay no start);
    after IDLE_SECONDS without a build the workers exit; a build after that starts new ones and is still right."""
    dev = get_device(cl_device)
    monkeypatch.setattr(opencl_build, "IDLE_SECONDS", 60.0)
    pool = opencl_build._pool(*opencl_build.device_index(dev.dev))  # type: ignore[attr-defined]
    pool.close()
    kernels = [_scale_kernel(f) for f in (2.0, -0.5, 4.0)]
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    first = opencl_build.build_binaries(dev.dev, [kernels[0][0]], workers=2)  # type: ignore[attr-defined]
    started = [p.pid for p in pool.procs]
    second = opencl_build.build_binaries(dev.dev, [kernels[1][0]], workers=1)  # type: ignore[attr-defined]
    assert len(started) == 2 and [p.pid for p in pool.procs] == started
    assert set(first) == set(second) == {0}
    procs = list(pool.procs)
    monkeypatch.setattr(opencl_build, "IDLE_SECONDS", 0.05)
    third = opencl_build.build_binaries(dev.dev, [kernels[2][0]], workers=1)  # type: ignore[attr-defined]
    for p in procs:
        assert p.wait(timeout=20) == 0  # the idle timer closed their stdin and they left their loop
    assert pool.procs == []
    import pyopencl as cl

    for (_, name), binary, f in zip(kernels, (first[0], second[0], third[0]), (2.0, -0.5, 4.0), strict=True):
        prog = cl.Program(dev.ctx, [dev.dev], [binary]).build()  # type: ignore[attr-defined]
        np.testing.assert_array_equal(_run(dev, CLProgram(dev, getattr(prog, name)), x), np.float32(f) * x)


@pytest.mark.parametrize("cl_device", CL_DEVICES)
def test_plan_prestarts_workers_it_then_builds_with(
    cl_device: str, tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan whose first rendered kernels are not in the cache starts the build workers while it renders the rest
    (Device.expect_builds); the build then runs on those same processes and its kernels compute what they say. Once
    they are cached, expecting them again starts nothing."""
    dev = get_device(cl_device)
    monkeypatch.setattr(opencl_build, "workers_help", lambda _dev: True)  # as on NVIDIA with its JIT cache on
    monkeypatch.setattr(opencl_build, "IDLE_SECONDS", 60.0)
    pool = opencl_build._pool(*opencl_build.device_index(dev.dev))  # type: ignore[attr-defined]
    pool.close()
    factors = [0.5 * i - 2.0 for i in range(opencl_build.MIN_KERNELS)]
    kernels = [_scale_kernel(f) for f in factors]
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        dev.expect_builds([src for src, _ in kernels], 3 * len(kernels))
        started = [p.pid for p in pool.procs]
        assert len(started) == opencl_build.worker_count(3 * len(kernels))
        progs = dev.compile_batch(kernels)
        assert [p.pid for p in pool.procs] == started  # the build took the prestarted workers, started no others
        for prog, f in zip(progs, factors, strict=True):
            np.testing.assert_array_equal(_run(dev, prog, x), np.float32(f) * x)
        pool.close()
        dev.expect_builds([src for src, _ in kernels], 3 * len(kernels))
        assert pool.procs == []
