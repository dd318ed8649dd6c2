"""The plait error hierarchy: every user-facing failure is a PlaitError naming the problem and the way out."""

from __future__ import annotations


class PlaitError(Exception):
    """Base class of every error plait raises on purpose."""


class ShapeError(PlaitError, ValueError):
    """Shapes that cannot agree (broadcasting, matmul, reshape, concat...)."""


class DTypeError(PlaitError, TypeError):
    """A dtype that an op or device does not support."""


class DeviceError(PlaitError, RuntimeError):
    """An unknown device string, or a device that is present but cannot be used."""


class CompileError(PlaitError, RuntimeError):
    """A generated kernel failed to build on its device; the message carries the compiler log."""


class UnsupportedError(PlaitError, NotImplementedError):
    """An op, attribute or model feature plait does not implement (yet)."""


class TileError(PlaitError, ValueError):
    """A malformed contraction in the Tile language, reported at definition time."""


class TraceError(PlaitError, RuntimeError):
    """A step given to plait.compile_step does something a replay of recorded kernels cannot reproduce."""
