"""Element scatter with a reduction, and the indices of the top k of each row: two custom kernels.

`scatter_rows` writes updates into a copy of each row of a 2-D tensor at data-dependent positions (ONNX
ScatterElements, ScatterND, TensorScatter, MaxUnpool and Col2Im all lower to it); `topk_rows` ranks each row's
elements (ONNX TopK). Both render one whole kernel per dialect, like the row gather in indexing.py, and give the
same answer on every device: updates are applied in index order, and ties in a ranking go to the lower position.
"""

from __future__ import annotations

from typing import Any

from plait import dtypes
from plait.codegen.cstyle import RenderedKernel
from plait.errors import DTypeError, ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register
from plait.graph.ops.indexing import _finish, _launch, _params

REDUCTIONS = ("none", "add", "mul", "max", "min")


def scatter_rows(data: Node, index: Node, updates: Node, reduction: str = "none") -> Node:
    """out = data, then in each row r, for k in order: out[r, index[r, k]] = reduce(out[r, index[r, k]],
    updates[r, k]) for a 2-D data (R, L) and index and updates (R, K). `reduction` "none" overwrites (the last
    update to a position wins); positions outside [0, L) are skipped. Rows are independent, so a scatter along
    one axis (a cache write, ScatterElements) costs O(K) per output element, not O(all updates)."""
    if len(data.shape) != 2 or len(index.shape) != 2 or index.shape != updates.shape or index.shape[0] != data.shape[0]:
        raise ShapeError(
            f"scatter_rows: need a 2-D data (R, L) and index and updates of one shape (R, K), got {data.shape},"
            f" {index.shape} and {updates.shape}"
        )
    if index.dtype not in (dtypes.int32, dtypes.int64):
        raise DTypeError(f"scatter_rows: the index must be int32 or int64, got {index.dtype.name}")
    if updates.dtype != data.dtype:
        raise DTypeError(f"scatter_rows: updates are {updates.dtype.name} but data is {data.dtype.name}; cast one")
    if reduction not in REDUCTIONS:
        raise UnsupportedError(f"scatter_rows: reduction {reduction!r} is not one of {REDUCTIONS}")
    return Node("scatter_rows", (data, index, updates), reduction, data.shape, data.dtype, data.device)


def topk_rows(x: Node, k: int, largest: bool = True) -> Node:
    """The positions (int64, shape (R, k)) of the k largest (or smallest) elements of each row of a 2-D x, best
    first; equal values keep their order (the lower position first) and NaN ranks above every number."""
    if len(x.shape) != 2 or not 0 <= k <= x.shape[1]:
        raise ShapeError(f"topk_rows: need a 2-D input and 0 <= k <= its row length, got {x.shape} and k={k}")
    return Node("topk_rows", (x,), (k, largest), (x.shape[0], k), dtypes.int64, x.device)


def _combine(reduction: str, acc: str, val: str) -> str:
    return {
        "none": val,
        "add": f"{acc} + {val}",
        "mul": f"{acc} * {val}",
        "max": f"({val} > {acc} ? {val} : {acc})",
        "min": f"({val} < {acc} ? {val} : {acc})",
    }[reduction]


def _scatter_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    rows, length = out.shape
    k = inputs[1].shape[1]
    dt = out.dtype
    ct = r.compute_type(dt)
    params = _params(r, out, inputs)
    new = _combine(str(out.arg), "acc", "val")
    if r.dialect == "c":
        body = (
            "#pragma omp parallel for schedule(static)\n"
            f"  for (long row = 0; row < {rows}; row++) {{\n"
            f"    for (long i = 0; i < {length}; i++) b0[row * {length} + i] = b1[row * {length} + i];\n"
            f"    for (long k = 0; k < {k}; k++) {{\n"
            f"      long i = (long)b2[row * {k} + k];\n"
            f"      if (i < 0 || i >= {length}) continue;\n"
            f"      {ct} acc = {r.load(dt, 'b0', f'row * {length} + i')}, val = {r.load(dt, 'b3', f'row * {k} + k')};\n"
            f"      {r.store(dt, 'b0', f'row * {length} + i', new)}\n"
            "    }\n  }\n"
        )
        return _finish(r, "scatter_rows", out, params, body, (1,), None)
    # one work-item per output element walks its row's updates in order: no atomics, the C kernel's order
    gs, ls, head = _launch(r, rows * length)
    body = (
        head + f"  long row = gid / {length}, i = gid % {length};\n"
        f"  {ct} acc = {r.load(dt, 'b1', 'gid')};\n"
        f"  for (long k = 0; k < {k}; k++) if ((long)b2[row * {k} + k] == i) {{\n"
        f"    {ct} val = {r.load(dt, 'b3', f'row * {k} + k')};\n"
        f"    acc = {new};\n  }}\n"
        f"  {r.store(dt, 'b0', 'gid', 'acc')}\n"
    )
    return _finish(r, "scatter_rows", out, params, body, gs, ls)


def _topk_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    rows, n = inputs[0].shape
    k, largest = out.arg
    dt = inputs[0].dtype
    ct = r.compute_type(dt)
    params = _params(r, out, inputs)
    # a NaN sorts as +inf (above every number), so every element gets a distinct rank and each output is written
    key = (lambda v: f"(isnan({v}) ? INFINITY : {v})") if dt.is_float else (lambda v: v)
    better = ">" if largest else "<"
    rank = (
        f"    {ct} xi = {key(r.load(dt, 'b1', 'row * ' + str(n) + ' + i'))};\n"
        "    long rank = 0;\n"
        f"    for (long j = 0; j < {n}; j++) {{\n"
        f"      {ct} xj = {key(r.load(dt, 'b1', 'row * ' + str(n) + ' + j'))};\n"
        f"      rank += (xj {better} xi) || (xj == xi && j < i);\n"
        "    }\n"
        f"    if (rank < {k}) b0[row * {k} + rank] = i;\n"
    )
    if r.dialect == "c":
        body = (
            "#pragma omp parallel for schedule(static)\n"
            f"  for (long e = 0; e < {rows * n}; e++) {{\n"
            f"    long row = e / {n}, i = e % {n};\n" + rank + "  }\n"
        )
        return _finish(r, "topk", out, params, body, (1,), None)
    gs, ls, head = _launch(r, rows * n)
    body = head + f"  {{\n    long row = gid / {n}, i = gid % {n};\n" + rank + "  }\n"
    return _finish(r, "topk", out, params, body, gs, ls)


register(OpDef("scatter_rows", "custom", kernel=_scatter_kernel))
register(OpDef("topk_rows", "custom", kernel=_topk_kernel))
