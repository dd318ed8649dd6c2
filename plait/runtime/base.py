"""The interface every device kind implements: Device, Buffer + Allocator, Compiler, Program.

A runtime module (cpu.py, opencl.py) subclasses these and is listed in plait.runtime.REGISTRY.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Buffer:
    """Device memory of `nbytes`; `handle` is what kernels receive (a pointer, a cl.Buffer...)."""

    device: Device
    nbytes: int
    handle: Any
    managed: bool = False  # returned to the allocator's pool when this object dies


class Allocator:
    """alloc/free/copy_in/copy_out; implementations may cache freed blocks by size."""

    def alloc(self, nbytes: int) -> Buffer:
        raise NotImplementedError

    def free(self, nbytes: int, handle: Any) -> None:
        """Return memory to the allocator (called when the last Buffer object holding `handle` dies)."""
        raise NotImplementedError

    def copy_in(self, buf: Buffer, src: np.ndarray) -> None:
        raise NotImplementedError

    def copy_out(self, buf: Buffer, dst: np.ndarray) -> None:
        raise NotImplementedError


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

    def synchronize(self) -> None:
        raise NotImplementedError
