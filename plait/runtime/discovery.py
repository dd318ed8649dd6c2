"""Device listing for `plait devices` and the test suite: every device, usable or not (with the reason),
and optionally a measured peak (GFLOP/s from a fused multiply-add loop, GB/s from a copy)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from plait.errors import PlaitError
from plait.runtime import get_device
from plait.runtime.base import Device


def usable_devices() -> list[str]:
    return [d["name"] for d in list_devices() if d["usable"]]  # type: ignore[misc]


def list_devices(measure: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    names = ["cpu"]
    try:
        from plait.runtime.opencl import discover

        found = discover()
    except PlaitError as e:
        found = [("opencl", None, str(e))]
    unusable = {n: why for n, _, why in found if why}
    names += [n for n, _, why in found if not why]
    for name in names:
        try:
            dev = get_device(name)
        except PlaitError as e:
            out.append({"name": name, "usable": False, "reason": str(e)})
            continue
        info = dev.info
        row: dict[str, Any] = {
            "name": dev.name,
            "usable": True,
            "kind": info.kind,
            "device": info.name,
            "driver": info.driver,
            "compute_units": info.compute_units,
            "memory_gib": round(info.memory_bytes / 2**30, 1),
        }
        if measure:
            row.update(measure_peak(dev))
        out.append(row)
    for name, why in unusable.items():
        out.append({"name": name, "usable": False, "reason": why})
    return out


def _fma_source(dev: Device, n: int, iters: int) -> tuple[str, str]:
    name = "peak_fma"
    body = (
        f"float a = (float)gid * 1e-9f, b = 0.999f, c = 1e-3f, d = a + 1.0f, e = a + 2.0f, f = a + 3.0f, g = a + 4.0f;\n"
        f"  for (int i = 0; i < {iters}; i++) {{ a = a * b + c; d = d * b + c; e = e * b + c; f = f * b + c; g = g * b + c;"
        f" a = a * b + c; d = d * b + c; e = e * b + c; f = f * b + c; g = g * b + c; }}\n"
        f"  out[gid] = a + d + e + f + g;"
    )
    if dev.renderer.dialect == "c":
        src = (
            f"void {name}(float* restrict out) {{\n#pragma omp parallel for\n"
            f"for (int gid = 0; gid < {n}; gid++) {{\n  {body}\n}}\n}}\n"
        )
    else:
        src = f"__kernel void {name}(__global float* restrict out) {{\n  int gid = get_global_id(0);\n  {body}\n}}\n"
    return name, src


def _copy_source(dev: Device, n: int) -> tuple[str, str]:
    name = "peak_copy"
    if dev.renderer.dialect == "c":
        src = f"void {name}(float* restrict o, const float* restrict x) {{\n#pragma omp parallel for simd\nfor (long i = 0; i < {n}; i++) o[i] = x[i];\n}}\n"
    else:
        src = f"__kernel void {name}(__global float* restrict o, __global const float* restrict x) {{ o[get_global_id(0)] = x[get_global_id(0)]; }}\n"
    return name, src


def _time(dev: Device, launch: Any, reps: int = 5) -> float:
    launch()
    dev.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        launch()
        dev.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def measure_peak(dev: Device) -> dict[str, float]:
    """GFLOP/s of a register-resident multiply-add loop and GB/s of a large copy, on `dev`."""
    gpu = dev.info.extra.get("gpu", False)
    n = dev.info.compute_units * (8192 if gpu else 64) * 16
    iters = 4096 if gpu else 2048
    name, src = _fma_source(dev, n, iters)
    out = dev.allocator.alloc(4 * n)
    t = _time(dev, dev.compile(src, name).bind([out], (n,), None))
    gflops = n * iters * 10 * 2 / t / 1e9
    m = 1 << 25
    a, b = dev.allocator.alloc(4 * m), dev.allocator.alloc(4 * m)
    name, src = _copy_source(dev, m)
    t = _time(dev, dev.compile(src, name).bind([a, b], (m,), None))
    for buf in (out, a, b):
        dev.allocator.free(buf.nbytes, buf.handle)
    return {"peak_gflops": round(gflops, 1), "peak_gbps": round(2 * 4 * m / t / 1e9, 1)}
