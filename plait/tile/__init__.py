"""plait.tile: write ops as index arithmetic (contractions) and get forward, backward and tiled kernels.

>>> import plait
>>> from plait import tile
>>> @tile.op
... def matmul(A, B):
...     i, j, k = tile.indices("i j k")
...     C = tile.output((A.shape[0], B.shape[1]))
...     C[i, j] += A[i, k] * B[k, j]
...     return C
>>> a = plait.tensor([[1.0, 2.0], [3.0, 4.0]], device="cpu")
>>> matmul(a, a).numpy().tolist()
[[7.0, 10.0], [15.0, 22.0]]
"""

from plait.tile import graph as _graph  # noqa: F401  (registers the "tile" op)
from plait.tile.lang import (
    Output,
    Ref,
    Value,
    abs,
    exp,
    index,
    indices,
    input,
    log,
    max,
    maximum,
    min,
    minimum,
    op,
    output,
    prod,
    relu,
    sigmoid,
    sqrt,
    sum,
    tanh,
    where,
)
from plait.tile.spec import Aff, Constraint, Spec

__all__ = [
    "Aff",
    "Constraint",
    "Output",
    "Ref",
    "Spec",
    "Value",
    "abs",
    "exp",
    "index",
    "indices",
    "input",
    "log",
    "max",
    "maximum",
    "min",
    "minimum",
    "op",
    "output",
    "prod",
    "relu",
    "sigmoid",
    "sqrt",
    "sum",
    "tanh",
    "where",
]
