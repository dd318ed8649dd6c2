"""Views and copies that move elements: view/reshape, permute, expand, squeeze, slice/select (and their scatter
transposes), split, cat, flip, constant padding, arange."""

from __future__ import annotations

import sys
from typing import Any

import torch

from plait import dtypes
from plait.frontends.native.tensor import Tensor, cat, stack, where
from plait.frontends.torch.lowering import aten, plait_dtype, register
from plait.frontends.torch.lowering.vjp import vjp1


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(x: Tensor, size: list[int]) -> Tensor:
    return x.reshape(*size)


@register(aten.permute.default)
def permute(x: Tensor, dims: list[int]) -> Tensor:
    return x.permute(*dims) if x.ndim else x


@register(aten.t.default)
def t(x: Tensor) -> Tensor:
    return x.transpose(0, 1) if x.ndim == 2 else x


@register(aten.transpose.int)
def transpose(x: Tensor, a: int, b: int) -> Tensor:
    return x.transpose(a, b) if x.ndim else x


@register(aten.expand.default)
def expand(x: Tensor, size: list[int], implicit: bool = False) -> Tensor:
    return x.expand(*size)


@register(aten.unsqueeze.default)
def unsqueeze(x: Tensor, dim: int) -> Tensor:
    return x.unsqueeze(dim)


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(x: Tensor, dim: Any = None) -> Tensor:
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    drop = {d % x.ndim for d in dims if x.shape[d % x.ndim] == 1}
    return x.reshape(*(s for i, s in enumerate(x.shape) if i not in drop))


@register(aten.cat.default)
def cat_(tensors: list[Tensor], dim: int = 0) -> Tensor:
    parts = [p for p in tensors if not (p.ndim == 1 and p.shape[0] == 0)]  # torch skips legacy empty (0,) parts
    return cat(parts, dim)


@register(aten.stack.default)
def stack_(tensors: list[Tensor], dim: int = 0) -> Tensor:
    return stack(tensors, dim)


def _slice_key(x: Tensor, dim: int, start: Any, end: Any, step: int) -> tuple[Any, ...]:
    d = dim % x.ndim
    s = None if start is None else start
    e = None if end is None or end >= sys.maxsize else end
    return (slice(None),) * d + (slice(s, e, step),)


@register(aten.slice.Tensor)
def slice_(x: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Tensor:
    return x[_slice_key(x, dim, start, end, step)]


@register(aten.select.int)
def select(x: Tensor, dim: int, index: int) -> Tensor:
    return x[(slice(None),) * (dim % x.ndim) + (index,)]


def _scatter(x: Tensor, src: Tensor, key: tuple[Any, ...]) -> Tensor:
    """x with the region `key` replaced by src: the transpose of the slice places src, a mask picks it."""
    placed = vjp1(lambda t: t[key], x.astype(src.dtype), src)
    mask = vjp1(
        lambda t: t[key],
        Tensor.full(x.shape, 0.0, dtypes.float32, x.device),
        Tensor.full(src.shape, 1.0, dtypes.float32, x.device),
    )
    return where(mask > 0.5, placed.astype(x.dtype), x)


@register(aten.slice_scatter.default)
def slice_scatter(x: Tensor, src: Tensor, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Tensor:
    return _scatter(x, src, _slice_key(x, dim, start, end, step))


@register(aten.select_scatter.default)
def select_scatter(x: Tensor, src: Tensor, dim: int, index: int) -> Tensor:
    d = dim % x.ndim
    return _scatter(x, src.unsqueeze(d), (slice(None),) * d + (slice(index % x.shape[d], index % x.shape[d] + 1),))


@register(aten.split_with_sizes.default)
def split_with_sizes(x: Tensor, sizes: list[int], dim: int = 0) -> list[Tensor]:
    return x.split(list(sizes), dim % x.ndim)


@register(aten.split.Tensor)
def split(x: Tensor, size: int, dim: int = 0) -> list[Tensor]:
    return x.split(int(size), dim % x.ndim)


@register(aten.unbind.int)
def unbind(x: Tensor, dim: int = 0) -> list[Tensor]:
    d = dim % x.ndim
    return [select(x, d, i) for i in range(x.shape[d])]


@register(aten.flip.default)
def flip(x: Tensor, dims: list[int]) -> Tensor:
    return x.flip(tuple(dims))


@register(aten.constant_pad_nd.default)
def constant_pad_nd(x: Tensor, pad: list[int], value: float = 0.0) -> Tensor:
    pairs = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        pairs[x.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return x.pad(pairs, value)


def _arange_dtype(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype in (torch.int64, torch.int32, torch.float32)


@register(aten.arange.start_step, aten.arange.start, aten.arange.default, supports=_arange_dtype)
def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    import numpy as np

    from plait.frontends.torch.partition import current_device

    if end is None:
        start, end = 0, start
    values = np.arange(start, end, step)
    dt = plait_dtype(dtype) if dtype is not None else dtypes.float32 if values.dtype.kind == "f" else dtypes.int64
    return Tensor.from_numpy(values.astype(dt.np), device=current_device())
