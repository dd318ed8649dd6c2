"""Every environment variable plait reads, typed and documented in one table.

Use `settings.get("PLAIT_DEVICE")` to read one and `with settings.override(PLAIT_DEBUG=1): ...` in tests.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    name: str
    type: type
    default: Any
    doc: str


REGISTRY: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("PLAIT_DEVICE", str, "", "default device ('cpu', 'opencl', 'opencl:N'); empty: the fastest usable one"),
        Setting("PLAIT_DEBUG", int, 0, "1: log each compiled kernel; 2: also print generated source"),
        Setting(
            "PLAIT_DUMP_DIR", str, "", "folder to write every compilation stage into (graph, source) for debugging"
        ),
        Setting("PLAIT_CACHE_DIR", str, "", "kernel cache folder; empty: the user cache dir from platformdirs"),
        Setting("PLAIT_CC", str, "", "C compiler for the cpu device; empty: cc, gcc or clang, whichever exists"),
        Setting("PLAIT_NUM_THREADS", int, 0, "threads for the cpu device; 0: all cores"),
        Setting(
            "PLAIT_CPU_VECTOR",
            int,
            0,
            "floats per vector register that the cpu kernels are written for (4, 8 or 16); 0: the host's own (16 with"
            " AVX-512, 8 with AVX2, else 4). Another width is for testing: it computes right but runs slowly",
        ),
        Setting(
            "PLAIT_PIN_THREADS",
            int,
            1,
            "1: a cpu team's worker threads each keep a CPU of their own (the calling thread is never pinned; teams"
            " larger than the allowed CPUs are not pinned); 0: leave thread placement to the OS scheduler",
        ),
        Setting(
            "PLAIT_WINOGRAD",
            str,
            "auto",
            "cpu 3x3 convolutions: 'auto' (Winograd where measured to win), 'off' (always the implicit GEMM; exact to"
            " FP32 rounding of a direct sum), '2' or '4' (Winograd F(2,3) / F(4,3) wherever it applies)",
        ),
        Setting(
            "PLAIT_WINOGRAD_CL",
            str,
            "auto",
            "OpenCL 3x3, 5x5 convs: 'auto' (wide layers), 'off', '2' (all), '4' (all, 3x3 forwards as F(4,3))",
        ),
        Setting(
            "PLAIT_REUSE_BUFFERS",
            int,
            1,
            "1: a plan's intermediates share storage once their last reader has run (memory plan); 0: every"
            " intermediate keeps a buffer of its own (to compare peak memory or rule the plan out when debugging)",
        ),
        Setting("PLAIT_HYPOTHESIS_EXAMPLES", int, 25, "examples per hypothesis test"),
    )
}

_overrides: dict[str, Any] = {}


def get(name: str) -> Any:
    """The value of a registered setting: an override, else the environment, else the default."""
    s = REGISTRY[name]
    if name in _overrides:
        return _overrides[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return s.default
    return s.type(raw)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Temporarily set settings (for tests)."""
    for k in values:
        if k not in REGISTRY:
            raise KeyError(f"unknown plait setting {k}")
    saved = dict(_overrides)
    _overrides.update(values)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)
