"""Device runtimes behind one interface, registered in one explicit table (kind -> Device class)."""

from __future__ import annotations

import functools
from typing import Any

from plait import settings
from plait.errors import DeviceError
from plait.runtime.base import Buffer, Device


def _cpu() -> type[Device]:
    from plait.runtime.cpu import CPUDevice

    return CPUDevice


def _opencl() -> type[Device]:
    from plait.runtime.opencl import OpenCLDevice

    return OpenCLDevice


REGISTRY: dict[str, Any] = {"cpu": _cpu, "opencl": _opencl}


def canonical(name: str) -> str:
    """Normalise a device string ('CPU', 'opencl', 'opencl:1'); unknown kinds raise DeviceError."""
    if not isinstance(name, str):
        raise DeviceError(f"a device is a string like 'cpu' or 'opencl:0', got {name!r}")
    name = name.strip().lower()
    kind, _, index = name.partition(":")
    if kind not in REGISTRY or (index and not index.isdigit()) or (kind == "cpu" and index not in ("", "0")):
        raise DeviceError(f"unknown device {name!r}; use 'cpu', 'opencl' or 'opencl:N' (`plait devices` lists them)")
    if kind == "cpu":
        return "cpu"
    if not index:
        return get_device("opencl").name
    return name


@functools.cache
def _open(name: str) -> Device:
    kind = name.partition(":")[0]
    return REGISTRY[kind]()(name)


def get_device(name: str) -> Device:
    return _open(name.strip().lower() if name.strip().lower() in ("cpu", "opencl") else canonical(name))


def default_device() -> str:
    """PLAIT_DEVICE if set; else an OpenCL GPU if one works; else the cpu device (generated C)."""
    configured = settings.get("PLAIT_DEVICE")
    if configured:
        return canonical(configured)
    return _fastest()


@functools.cache
def _fastest() -> str:
    from plait.runtime.opencl import discover

    try:
        for name, dev, why in discover():
            if why is None and dev is not None and dev.type & 4:  # CL_DEVICE_TYPE_GPU
                return name
    except DeviceError:
        pass
    return "cpu"


__all__ = ["REGISTRY", "Buffer", "Device", "canonical", "default_device", "get_device"]
