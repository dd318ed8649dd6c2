"""The ONNX operator table: op_type -> implementation, registered explicitly by each op-family module.

An implementation is `fn(ctx, inputs) -> value or list of values`, where a value is a plait Tensor (computed on
the device) or a NumPy array (known on the host at import time). `fold`, when given, computes the op on the host
with NumPy; the importer uses it whenever every input is a host array, which is how shape-computing subgraphs
(Shape -> Gather -> Concat -> Reshape) disappear before anything is compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OpFn = Callable[..., Any]


@dataclass(frozen=True)
class OnnxOp:
    name: str
    fn: OpFn
    fold: OpFn | None = None
    sequences: bool = False  # takes sequence values (the importer refuses them to every other op)


TABLE: dict[str, OnnxOp] = {}


def register(name: str, fn: OpFn, fold: OpFn | None = None, *, sequences: bool = False) -> None:
    if name in TABLE:
        raise ValueError(f"ONNX op {name} registered twice")
    TABLE[name] = OnnxOp(name, fn, fold, sequences)


def load_all() -> dict[str, OnnxOp]:
    """The table with every op family registered (imported on first use: the families import the importer)."""
    from plait.onnx.ops import (  # noqa: F401
        attention,
        control,
        elementwise,
        geometry,
        linalg,
        nn,
        quant,
        reduce,
        resize,
        rnn,
        scatter,
        shape,
        signal,
        sorting,
        text,
        transformer,
    )

    return TABLE
