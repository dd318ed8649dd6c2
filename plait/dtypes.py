"""plait dtypes: a small closed set, each with its NumPy twin and a promotion rank."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from plait.errors import DTypeError


@dataclass(frozen=True)
class DType:
    """A tensor element type. `rank` orders promotion: bool < int32 < int64 < float16 < float32."""

    name: str
    np: type
    itemsize: int
    rank: int

    @property
    def is_float(self) -> bool:
        return self.name.startswith("float")

    @property
    def is_int(self) -> bool:
        return self.name.startswith("int")

    def __repr__(self) -> str:
        return f"plait.{self.name}"


bool_ = DType("bool", np.bool_, 1, 0)
int32 = DType("int32", np.int32, 4, 1)
int64 = DType("int64", np.int64, 8, 2)
float16 = DType("float16", np.float16, 2, 3)
float32 = DType("float32", np.float32, 4, 4)

ALL = (bool_, int32, int64, float16, float32)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME["bool_"] = bool_
_BY_NP = {np.dtype(d.np): d for d in ALL}


def to_dtype(x: Any) -> DType:
    """Accept a plait DType, a NumPy dtype or a name ('float32'); anything else is a DTypeError."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    try:
        npd = np.dtype(x)
    except TypeError:
        npd = None
    if npd is not None and npd in _BY_NP:
        return _BY_NP[npd]
    if npd == np.float64:
        return float32
    names = ", ".join(d.name for d in ALL)
    raise DTypeError(f"unsupported dtype {x!r}; plait supports {names} (cast your data with .astype first)")


def from_numpy_dtype(npd: np.dtype) -> DType:
    """Map an array's dtype, narrowing float64 to float32 (plait computes in 32-bit floats)."""
    if npd == np.float64:
        return float32
    if npd in (np.int8, np.int16, np.uint8, np.uint16):
        return int32
    return to_dtype(npd)


def promote(a: DType, b: DType) -> DType:
    """The result dtype of combining two tensors, as NumPy does it (then narrowed to plait's dtypes).

    bool < int32 < int64 < float16 < float32, except that an integer with float16 gives float32: NumPy promotes
    int32/int64 with float16 to float64 (float16 cannot hold their range), which plait narrows to float32.
    PyTorch would answer float16 there; Python scalars follow PyTorch instead (see Tensor._binary).
    """
    hi, lo = (a, b) if a.rank >= b.rank else (b, a)
    if hi == float16 and lo.is_int:
        return float32
    return hi
