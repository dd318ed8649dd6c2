"""The lowering table: one entry per ATen overload (torch.ops.aten.*), mapping it to a function on plait Tensors.

Each family module (elementwise, reduce, movement, linalg, nn) registers its entries explicitly with `register`.
A lowering receives the node's args and kwargs with every fx value already replaced by its plait value (a Tensor,
a Python number or a list of those) and returns a Tensor, or a tuple of them for multi-output ops. `supports`, when
given, looks at the fx node (its args and FakeTensor metadata) and says whether this call can run in plait; the
partitioner leaves calls it rejects to PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from plait import dtypes
from plait.dtypes import DType

aten = torch.ops.aten

# torch dtypes a plait partition accepts (float64, float16, bfloat16, complex, uint8 ... fall back to PyTorch)
DTYPES: dict[torch.dtype, DType] = {
    torch.float32: dtypes.float32,
    torch.int64: dtypes.int64,
    torch.int32: dtypes.int32,
    torch.bool: dtypes.bool_,
}


@dataclass(frozen=True)
class Lowering:
    op: Any  # an OpOverload
    fn: Callable[..., Any]
    supports: Callable[[torch.fx.Node], bool] | None = None


LOWERINGS: dict[Any, Lowering] = {}


def register(*ops: Any, supports: Callable[[torch.fx.Node], bool] | None = None) -> Callable[..., Any]:
    """Decorator: lower every overload in `ops` with the decorated function."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"lowering for {op} registered twice")
            LOWERINGS[op] = Lowering(op, fn, supports)
        return fn

    return wrap


def plait_dtype(dt: torch.dtype) -> DType:
    return DTYPES[dt]


def _load_families() -> None:
    from plait.frontends.torch.lowering import elementwise, linalg, movement, nn, reduce  # noqa: F401


_load_families()
