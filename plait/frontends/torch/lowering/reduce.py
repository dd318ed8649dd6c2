"""Reductions and softmax: sum, mean, amax/amin, argmax/argmin, var, softmax and log-softmax with their backward."""

from __future__ import annotations

from typing import Any

import torch

from plait.frontends.native.tensor import Tensor
from plait.frontends.torch.lowering import aten, plait_dtype, register
from plait.nn import functional as F


def _axes(x: Tensor, dim: Any) -> Any:
    """ATen's dim lists: None or [] mean every axis."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return dim


def _cast(x: Tensor, dtype: torch.dtype | None) -> Tensor:
    return x.astype(plait_dtype(dtype)) if dtype is not None else x


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(x: Tensor, dim: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Tensor:
    return _cast(x, dtype).sum(_axes(x, dim), keepdim)


@register(aten.mean.dim, aten.mean.default)
def mean(x: Tensor, dim: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Tensor:
    return _cast(x, dtype).mean(_axes(x, dim), keepdim)


@register(aten.amax.default)
def amax(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return x.max(_axes(x, dim), keepdim)


@register(aten.amin.default)
def amin(x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return x.min(_axes(x, dim), keepdim)


@register(aten.argmax.default)
def argmax(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return x.argmax(dim, keepdim)


@register(aten.argmin.default)
def argmin(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return x.argmin(dim, keepdim)


@register(aten.max.dim)
def max_dim(x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    return x.max(dim, keepdim), x.argmax(dim, keepdim)


@register(aten.min.dim)
def min_dim(x: Tensor, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    return x.min(dim, keepdim), x.argmin(dim, keepdim)


@register(aten.var.correction)
def var(x: Tensor, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Tensor:
    return x.var(_axes(x, dim), keepdim, 1 if correction is None else int(correction))


@register(aten._softmax.default)
def softmax(x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return F.softmax(x, dim)


@register(aten._log_softmax.default)
def log_softmax(x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    return F.log_softmax(x, dim)


@register(aten._softmax_backward_data.default)
def softmax_backward(g: Tensor, y: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    gy = g * y
    return gy - y * gy.sum(dim, keepdims=True)


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward(g: Tensor, y: Tensor, dim: int, input_dtype: torch.dtype) -> Tensor:
    return g - y.exp() * g.sum(dim, keepdims=True)
