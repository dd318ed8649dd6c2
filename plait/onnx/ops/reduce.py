"""Reductions: Reduce{Sum,Mean,Max,Min,Prod,L1,L2,LogSum,LogSumExp,SumSquare}, ArgMax/ArgMin, CumSum.

The axes moved from an attribute to an optional input in opset 13 (ReduceSum) and 18 (the others).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor
from plait.onnx.importer import Ctx
from plait.onnx.ops import register


def _axes(ctx: Ctx, ins: list[Any], input_from: int) -> tuple[int, ...] | None:
    nd = len(ins[0].shape)
    if ctx.opset >= input_from:
        axes = ctx.ints(ins[1], "axes") if len(ins) > 1 and ins[1] is not None else []
    else:
        axes = list(ctx.attr("axes", []))
    if not axes:
        return None if ctx.attr("noop_with_empty_axes", 0) else tuple(range(nd))
    for a in axes:
        if not -nd <= a < max(nd, 1):
            raise ctx.error(f"axis {a} is out of range for rank {nd}")
    return tuple(sorted({a % nd for a in axes})) if nd else ()


def _reduction(
    name: str,
    input_from: int,
    fn: Callable[[Tensor, tuple[int, ...], bool], Tensor],
    fold: Callable[[np.ndarray, tuple[int, ...], bool], np.ndarray] | None = None,
) -> None:
    def dev(ctx: Ctx, ins: list[Any]) -> Tensor:
        x = ctx.t(ins[0])
        axes = _axes(ctx, ins, input_from)
        if axes is None:
            return x
        keep = bool(ctx.attr("keepdims", 1))
        if x.ndim == 0:
            return fn(x.reshape(1), (0,), False)
        return fn(x, axes, keep)

    def host(ctx: Ctx, ins: list[Any]) -> np.ndarray:
        assert fold is not None
        axes = _axes(ctx, ins, input_from)
        x = ins[0]
        if axes is None:
            return x
        return np.asarray(fold(x, axes, bool(ctx.attr("keepdims", 1)))).astype(x.dtype)

    register(name, dev, host if fold else None)


def _sum(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    out = x.sum(axes, keep)
    return out.astype(x.dtype) if out.dtype != x.dtype else out


def _max(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    if any(x.shape[a] == 0 for a in axes):
        return Tensor.full(_kept(x.shape, axes, keep), -math.inf if x.dtype.is_float else _lowest(x), x.dtype, x.device)
    return x.max(axes, keep)


def _min(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    if any(x.shape[a] == 0 for a in axes):
        return Tensor.full(_kept(x.shape, axes, keep), math.inf if x.dtype.is_float else _highest(x), x.dtype, x.device)
    return x.min(axes, keep)


def _lowest(x: Tensor) -> int:
    return int(np.iinfo(x.dtype.np).min) if x.dtype.is_int else 0


def _highest(x: Tensor) -> int:
    return int(np.iinfo(x.dtype.np).max) if x.dtype.is_int else 1


def _kept(shape: tuple[int, ...], axes: tuple[int, ...], keep: bool) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(shape) if keep or i not in axes)


def _mean(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    if not x.dtype.is_float:
        return (x.sum(axes, keep).astype(dtypes.float32) / max(math.prod(x.shape[a] for a in axes), 1)).astype(x.dtype)
    return x.mean(axes, keep).astype(x.dtype)


def _logsumexp(x: Tensor, axes: tuple[int, ...], keep: bool) -> Tensor:
    if any(x.shape[a] == 0 for a in axes):
        return Tensor.full(_kept(x.shape, axes, keep), -math.inf, x.dtype, x.device)
    m = x.max(axes, True)
    m = (m == m).where(m.maximum(-3.0e38).minimum(3.0e38), 0.0)
    out = (x - m).exp().sum(axes, True).log() + m
    return out if keep else out.reshape(*_kept(x.shape, axes, False))


_reduction("ReduceSum", 13, _sum, lambda x, a, k: np.sum(x, axis=a, keepdims=k))
_reduction("ReduceMean", 18, _mean, lambda x, a, k: np.mean(x, axis=a, keepdims=k))
_reduction("ReduceMax", 18, _max, lambda x, a, k: np.max(x, axis=a, keepdims=k))
_reduction("ReduceMin", 18, _min, lambda x, a, k: np.min(x, axis=a, keepdims=k))
_reduction(
    "ReduceProd", 18, lambda x, a, k: x.prod(a, k).astype(x.dtype), lambda x, a, k: np.prod(x, axis=a, keepdims=k)
)
_reduction("ReduceL1", 18, lambda x, a, k: _sum(x.abs(), a, k))
_reduction("ReduceL2", 18, lambda x, a, k: _sum(x * x, a, k).astype(dtypes.float32).sqrt().astype(x.dtype))
_reduction("ReduceSumSquare", 18, lambda x, a, k: _sum(x * x, a, k))
_reduction("ReduceLogSum", 18, lambda x, a, k: _sum(x, a, k).log())
_reduction("ReduceLogSumExp", 18, _logsumexp)


def _arg(op: str) -> Callable[[Ctx, list[Any]], Tensor]:
    def fn(ctx: Ctx, ins: list[Any]) -> Tensor:
        x = ctx.t(ins[0])
        a = int(ctx.attr("axis", 0)) % max(x.ndim, 1)
        keep = bool(ctx.attr("keepdims", 1))
        if ctx.attr("select_last_index", 0):
            n = x.shape[a]
            r = getattr(x.flip(a), op)(a, keep)
            return (n - 1) - r
        return getattr(x, op)(a, keep)  # type: ignore[no-any-return]

    return fn


register("ArgMax", _arg("argmax"))
register("ArgMin", _arg("argmin"))


def _cumsum(ctx: Ctx, ins: list[Any]) -> Tensor:
    """A cumulative sum as a product with a constant triangular matrix (one GEMM; exact for the usual sizes)."""
    x = ctx.t(ins[0])
    a = int(ctx.host(ins[1], "axis").reshape(-1)[0]) % x.ndim
    n = x.shape[a]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    rev, excl = ctx.attr("reverse", 0), ctx.attr("exclusive", 0)
    keep = (j >= i) if rev else (j <= i)
    if excl:
        keep &= i != j
    moved = x.transpose(a, -1) if a != x.ndim - 1 else x
    tri = keep.T.astype(np.float32)
    if x.dtype.is_float:
        out = moved.astype(dtypes.float32) @ ctx.t(tri)
    else:
        out = (moved.unsqueeze(-1) * ctx.t(tri.astype(np.int64))).sum(-2)
    out = out.astype(x.dtype)
    return out.transpose(a, -1) if a != x.ndim - 1 else out


register("CumSum", _cumsum)
