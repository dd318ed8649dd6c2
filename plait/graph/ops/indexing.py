"""Data-dependent indexing: row gather (embedding lookup) and its transpose, row scatter-add (embedding gradient).

The elementwise codegen addresses memory with index arithmetic known at compile time, so a read whose address is
a loaded value needs its own kernel: both ops are kind "custom" and render one whole kernel per dialect. Their
sources arrive realized and contiguous (row-major); the first kernel parameter is the output buffer b0.
"""

from __future__ import annotations

import hashlib
from typing import Any

from plait import dtypes
from plait.codegen.cstyle import RenderedKernel
from plait.errors import DTypeError, ShapeError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


def gather_rows(table: Node, index: Node) -> Node:
    """out[m, :] = table[index[m], :] for a 2-D table (V, D) and a 1-D integer index (M,)."""
    if len(table.shape) != 2 or len(index.shape) != 1:
        raise ShapeError(f"gather_rows: need a (V, D) table and an (M,) index, got {table.shape} and {index.shape}")
    if index.dtype not in (dtypes.int32, dtypes.int64):
        raise DTypeError(f"gather_rows: the index must be int32 or int64, got {index.dtype.name}")
    return Node("gather_rows", (table, index), None, (index.shape[0], table.shape[1]), table.dtype, table.device)


def scatter_add_rows(src: Node, index: Node, rows: int) -> Node:
    """out[v, :] = sum of src[m, :] over every m with index[m] == v; out has `rows` rows (the transpose of gather)."""
    if len(src.shape) != 2 or len(index.shape) != 1 or src.shape[0] != index.shape[0]:
        raise ShapeError(
            f"scatter_add_rows: need an (M, D) source and an (M,) index, got {src.shape} and {index.shape}"
        )
    if index.dtype not in (dtypes.int32, dtypes.int64):
        raise DTypeError(f"scatter_add_rows: the index must be int32 or int64, got {index.dtype.name}")
    return Node("scatter_add_rows", (src, index), rows, (rows, src.shape[1]), src.dtype, src.device)


def _gather_vjp(n: Node, g: Node) -> tuple[Node | None, None]:
    table, index = n.srcs
    return scatter_add_rows(g, index, table.shape[0]), None


def _scatter_vjp(n: Node, g: Node) -> tuple[Node | None, None]:
    return gather_rows(g, n.srcs[1]), None


def _finish(r: Any, kind: str, out: Node, params: list[str], body: str, gs: tuple[int, ...], ls: Any) -> RenderedKernel:
    digest = hashlib.sha256((r.dialect + "".join(params) + body).encode()).hexdigest()[:10]
    name = f"{kind}_{'x'.join(map(str, out.shape))}_{digest}"
    return RenderedKernel(name, f"{r.preamble}{r.declare(name, params)} {{\n{body}}}\n", gs, ls)


def _params(r: Any, out: Node, inputs: list[Node]) -> list[str]:
    return [r.param(out.dtype, "b0", True)] + [r.param(n.dtype, f"b{i}", False) for i, n in enumerate(inputs, 1)]


def _launch(r: Any, n: int) -> tuple[tuple[int, ...], tuple[int, ...] | None, str]:
    """Global/local size and the guard line of a one-work-item-per-element OpenCL launch."""
    ls = min(r.local_size, max(1, n))
    gs = -(-n // ls) * ls
    return (gs,), (ls,), f"  long gid = get_global_id(0);\n  if (gid >= {n}) return;\n"


def _gather_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    v, d = inputs[0].shape
    m = out.shape[0]
    dt = out.dtype
    zero = r.literal(0, dt)
    params = _params(r, out, inputs)
    if r.dialect == "c":
        body = (
            "#pragma omp parallel for schedule(static)\n"
            f"  for (long m = 0; m < {m}; m++) {{\n"
            f"    long row = (long)b2[m];\n"
            f"    for (long j = 0; j < {d}; j++)\n"
            f"      b0[m * {d} + j] = (row >= 0 && row < {v}) ? b1[row * {d} + j] : {zero};\n"
            "  }\n"
        )
        return _finish(r, "gather", out, params, body, (1,), None)
    gs, ls, head = _launch(r, m * d)
    load = r.load(dt, "b1", f"row * {d} + j")
    body = (
        head + f"  long m = gid / {d}, j = gid % {d};\n  long row = (long)b2[m];\n"
        f"  {r.compute_type(dt)} val = (row >= 0 && row < {v}) ? {load} : {zero};\n"
        f"  {r.store(dt, 'b0', 'gid', 'val')}\n"
    )
    return _finish(r, "gather", out, params, body, gs, ls)


def _scatter_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    m, d = inputs[0].shape
    v = out.shape[0]
    dt = out.dtype
    ct = r.compute_type(dt)
    params = _params(r, out, inputs)
    if r.dialect == "c":
        # columns are split among threads, so each output element has one writer and the sum order is fixed
        body = (
            f"  for (long i = 0; i < {v * d}; i++) b0[i] = 0;\n"
            "#pragma omp parallel for schedule(static)\n"
            f"  for (long j0 = 0; j0 < {d}; j0 += 16) {{\n"
            f"    long j1 = j0 + 16 < {d} ? j0 + 16 : {d};\n"
            f"    for (long k = 0; k < {m}; k++) {{\n"
            f"      long row = (long)b2[k];\n"
            f"      if (row < 0 || row >= {v}) continue;\n"
            f"      for (long j = j0; j < j1; j++) b0[row * {d} + j] += b1[k * {d} + j];\n"
            "    }\n  }\n"
        )
        return _finish(r, "scatter", out, params, body, (1,), None)
    # one work-item per output element looping over the source rows: no float atomics, a fixed summation order
    gs, ls, head = _launch(r, v * d)
    load = r.load(dt, "b1", f"k * {d} + j")
    body = (
        head + f"  long row = gid / {d}, j = gid % {d};\n  {ct} acc = 0;\n"
        f"  for (long k = 0; k < {m}; k++) if ((long)b2[k] == row) acc += {load};\n"
        f"  {r.store(dt, 'b0', 'gid', 'acc')}\n"
    )
    return _finish(r, "scatter", out, params, body, gs, ls)


register(OpDef("gather_rows", "custom", vjp=_gather_vjp, kernel=_gather_kernel))
register(OpDef("scatter_add_rows", "custom", vjp=_scatter_vjp, kernel=_scatter_kernel))
