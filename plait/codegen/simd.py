"""The cpu device's vector width: how many floats one SIMD register of the machine holds, as the C compiler sees the
target with -march=native (16 with AVX-512, 8 with AVX/AVX2, 4 otherwise: SSE, NEON).

The C kernels are written with gcc's generic vector type `plait_vf` of this width and their register tiles are sized
for it. A generic vector wider than the target's registers is correct but ruinous with gcc 12: on an AVX2 host
(Zen 3) a 16-float type is lowered through memory, and a register-tiled product ran at 2-7 GFLOP/s instead of 84-92
(docs/benchmarks.md, "the vector width follows the host"). PLAIT_CPU_VECTOR forces a width (to test the other
widths' kernels on one machine; a width the target lacks is slow, never wrong).
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess

from plait import settings
from plait.errors import PlaitError

WIDTHS = (4, 8, 16)


def c_compiler() -> str | None:
    """The C compiler the cpu device builds with: PLAIT_CC, else the first of cc, gcc and clang on the PATH (None when
    there is none)."""
    configured = settings.get("PLAIT_CC")
    for cand in [configured] if configured else ["cc", "gcc", "clang"]:
        path = shutil.which(cand)
        if path:
            return path
    return None


@functools.cache
def native_macros() -> str:
    """The C compiler's predefined macros for -march=native (empty when there is no compiler: then nothing is
    built for the cpu device, and the device itself says why)."""
    cc = c_compiler()
    if cc is None:
        return ""
    try:
        res = subprocess.run(
            [cc, "-march=native", "-dM", "-E", "-x", "c", "-"], input="", capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return res.stdout if res.returncode == 0 else ""


def target_id() -> str:
    """A short fingerprint of the native target (instruction sets included), for keys of built kernels."""
    return hashlib.sha256(native_macros().encode()).hexdigest()[:16]


def _native_width(macros: str) -> int:
    defined = {line.split()[1] for line in macros.splitlines() if line.startswith("#define ")}
    if "__AVX512F__" in defined:
        return 16
    if "__AVX__" in defined:
        return 8
    return 4


@functools.cache
def vector_width() -> int:
    """Floats per vector register for the cpu kernels: PLAIT_CPU_VECTOR when set, else the native target's."""
    forced = settings.get("PLAIT_CPU_VECTOR")
    if forced:
        if forced not in WIDTHS:
            raise PlaitError(
                f"PLAIT_CPU_VECTOR={forced}: the cpu kernels are written for vectors of 4, 8 or 16 floats;"
                " set one of those, or unset it to use the host's width"
            )
        return int(forced)
    return _native_width(native_macros())
