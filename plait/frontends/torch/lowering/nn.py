"""Neural-network ATen ops: convolution, batch/layer norm, pooling, embedding, NLL loss, and their backward ops.

Forward ops call plait.nn.functional; backward ops are vector-Jacobian products of those same forward functions
(see lowering/vjp.py), except where the saved indices of max pooling fix which element gets the gradient.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from plait.frontends.native.tensor import Tensor, stack, where
from plait.frontends.torch.lowering import aten, register
from plait.frontends.torch.lowering.vjp import vjp, vjp1
from plait.graph.ops import indexing
from plait.nn import functional as F


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


# ---------------------------------------------------------------- convolution


def _conv_supported(node: torch.fx.Node) -> bool:
    x = _val(node.args[0])
    transposed = node.args[6] if len(node.args) > 6 else False
    return isinstance(x, torch.Tensor) and x.ndim in (3, 4) and not transposed


def _conv(x: Tensor, w: Tensor, b: Tensor | None, stride: Any, padding: Any, dilation: Any, groups: int) -> Tensor:
    if x.ndim == 3:  # conv1d as a conv2d over a height-1 image
        y = F.conv2d(x.unsqueeze(2), w.unsqueeze(2), b, (1, stride[0]), (0, padding[0]), (1, dilation[0]), groups)
        return y.squeeze(2)
    return F.conv2d(x, w, b, tuple(stride), tuple(padding), tuple(dilation), groups)


@register(aten.convolution.default, supports=_conv_supported)
def convolution(
    x: Tensor,
    w: Tensor,
    b: Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    out_pad: Any,
    groups: int,
) -> Tensor:
    return _conv(x, w, b, stride, padding, dilation, groups)


def _conv_bw_supported(node: torch.fx.Node) -> bool:
    x = _val(node.args[1])
    transposed = node.args[7] if len(node.args) > 7 else False
    return isinstance(x, torch.Tensor) and x.ndim in (3, 4) and not transposed


@register(aten.convolution_backward.default, supports=_conv_bw_supported)
def convolution_backward(
    g: Tensor,
    x: Tensor,
    w: Tensor,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    out_pad: Any,
    groups: int,
    mask: list[bool],
) -> tuple[Tensor | None, ...]:
    gx, gw = vjp(lambda a, k: _conv(a, k, None, stride, padding, dilation, groups), [x, w], g)
    gb = g.sum(axis=(0, *range(2, g.ndim))) if mask[2] else None
    return (gx if mask[0] else None, gw if mask[1] else None, gb)


# ---------------------------------------------------------------- normalisation


@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm_eval(
    x: Tensor, w: Tensor | None, b: Tensor | None, rm: Tensor, rv: Tensor, momentum: float, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    empty = Tensor.full((0,), 0.0, x.dtype, x.device)
    return F.batch_norm(x, rm, rv, w, b, False, momentum, eps), empty, empty


def _bn_train(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(out, batch mean, 1/sqrt(biased var + eps), unbiased var), all statistics of shape (C,)."""
    out, mean, var_unbiased = F.batch_norm_stats(x, None, None, w, b, True, eps)
    assert mean is not None and var_unbiased is not None
    count = x.numel() // x.shape[1]
    rstd = (var_unbiased * ((count - 1) / count) + eps).sqrt().reciprocal()
    return out, mean, rstd, var_unbiased


@register(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(
    x: Tensor, w: Tensor | None, b: Tensor | None, rm: Tensor, rv: Tensor, training: bool, momentum: float, eps: float
) -> tuple[Tensor, ...]:
    if not training:
        out, e1, e2 = batch_norm_eval(x, w, b, rm, rv, momentum, eps)
        return out, e1, e2, rm, rv
    out, mean, rstd, var_unbiased = _bn_train(x, w, b, eps)
    return out, mean, rstd, rm * (1.0 - momentum) + mean * momentum, rv * (1.0 - momentum) + var_unbiased * momentum


@register(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(
    x: Tensor, w: Tensor | None, b: Tensor | None, training: bool, momentum: float, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    out, mean, rstd, _ = _bn_train(x, w, b, eps)
    return out, mean, rstd


@register(aten.native_batch_norm_backward.default)
def batch_norm_backward(
    g: Tensor,
    x: Tensor,
    w: Tensor | None,
    rm: Tensor | None,
    rv: Tensor | None,
    save_mean: Tensor | None,
    save_rstd: Tensor | None,
    train: bool,
    eps: float,
    mask: list[bool],
) -> tuple[Tensor | None, ...]:
    axes = (0, *range(2, x.ndim))
    weight = w if w is not None else Tensor.full((x.shape[1],), 1.0, x.dtype, x.device)
    if train:
        gx, gw = vjp(lambda a, k: _bn_train(a, k, None, eps)[0], [x, weight], g)
    else:
        assert rm is not None and rv is not None
        gx, gw = vjp(lambda a, k: F.batch_norm(a, rm, rv, k, None, False, 0.0, eps), [x, weight], g)
    return (gx if mask[0] else None, gw if mask[1] and w is not None else None, g.sum(axis=axes) if mask[2] else None)


@register(aten.native_layer_norm.default)
def layer_norm(x: Tensor, shape: list[int], w: Tensor | None, b: Tensor | None, eps: float) -> tuple[Tensor, ...]:
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    rstd = ((d * d).mean(axis=axes, keepdims=True) + eps).sqrt().reciprocal()
    return F.layer_norm(x, shape, w, b, eps), mean, rstd


@register(aten.native_layer_norm_backward.default)
def layer_norm_backward(
    g: Tensor,
    x: Tensor,
    shape: list[int],
    mean: Tensor,
    rstd: Tensor,
    w: Tensor | None,
    b: Tensor | None,
    mask: list[bool],
) -> tuple[Tensor | None, ...]:
    """The closed form (eps is not an argument; it lives in the saved rstd)."""
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    lead = tuple(range(x.ndim - len(shape)))
    xhat = (x - mean) * rstd
    gxhat = g * w if w is not None else g
    gx = rstd * (gxhat - gxhat.mean(axis=axes, keepdims=True) - xhat * (gxhat * xhat).mean(axis=axes, keepdims=True))
    gw = (g * xhat).sum(axis=lead) if mask[1] and w is not None else None
    gb = g.sum(axis=lead) if mask[2] and b is not None else None
    return (gx if mask[0] else None, gw, gb)


# ---------------------------------------------------------------- pooling


def _out(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    if ceil:
        o = -(-span // s) + 1
        return o - 1 if (o - 1) * s >= size + p else o
    return span // s + 1


def _pool_geometry(x: Tensor, k: Any, s: Any, p: Any, d: Any, ceil: bool) -> tuple[tuple[int, int], ...]:
    kk = (int(k[0]), int(k[-1]))
    ss = (int(s[0]), int(s[-1])) if s else kk
    pp = (int(p[0]), int(p[-1])) if isinstance(p, (list, tuple)) else (int(p), int(p))
    dd = (int(d[0]), int(d[-1])) if isinstance(d, (list, tuple)) else (int(d), int(d))
    h, w = x.shape[-2:]
    oo = (_out(h, kk[0], ss[0], pp[0], dd[0], ceil), _out(w, kk[1], ss[1], pp[1], dd[1], ceil))
    return kk, ss, pp, dd, oo


def _windows(x: Tensor, geom: tuple[tuple[int, int], ...]) -> Tensor:
    """(N, C, OH, OW, kh*kw): every pooling window of x, padded with -inf (row-major over the kernel)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = geom
    h, w = x.shape[-2:]
    eh = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + 2 * ph))
    ew = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + 2 * pw))
    xp = x.pad(((0, 0), (0, 0), (ph, ph + eh), (pw, pw + ew)), -math.inf) if ph or pw or eh or ew else x
    views = [
        xp[:, :, i * dh : i * dh + (oh - 1) * sh + 1 : sh, j * dw : j * dw + (ow - 1) * sw + 1 : sw]
        for i in range(kh)
        for j in range(kw)
    ]
    return stack(views, -1)


def _flat_index(geom: tuple[tuple[int, int], ...], width: int) -> np.ndarray:
    """(OH, OW, K) int64: the flat input index (y * W + x) that window position k of output (oy, ox) reads."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (oh, ow) = geom
    oy, ox, ky, kx = np.meshgrid(np.arange(oh), np.arange(ow), np.arange(kh), np.arange(kw), indexing="ij")
    iy, ix = oy * sh - ph + ky * dh, ox * sw - pw + kx * dw
    return (iy * width + ix).reshape(oh, ow, kh * kw).astype(np.int64)


def _pool4(node: torch.fx.Node) -> bool:
    x = _val(node.args[0] if node.target != aten.max_pool2d_with_indices_backward.default else node.args[1])
    return isinstance(x, torch.Tensor) and x.ndim == 4


@register(aten.max_pool2d_with_indices.default, supports=_pool4)
def max_pool2d_with_indices(
    x: Tensor, k: Any, s: Any = (), p: Any = 0, d: Any = 1, ceil: bool = False
) -> tuple[Tensor, Tensor]:
    geom = _pool_geometry(x, k, s, p, d, ceil)
    win = _windows(x, geom)
    values = win.max(axis=-1)
    pos = win.argmax(axis=-1)  # the first maximum in window order, as torch picks it
    table = Tensor.from_numpy(_flat_index(geom, x.shape[-1]), device=x.device)
    onehot = pos.unsqueeze(-1) == Tensor.arange(win.shape[-1], device=x.device)
    return values, where(onehot, table, 0).sum(axis=-1)


@register(aten.max_pool2d_with_indices_backward.default, supports=_pool4)
def max_pool2d_backward(g: Tensor, x: Tensor, k: Any, s: Any, p: Any, d: Any, ceil: bool, indices: Tensor) -> Tensor:
    geom = _pool_geometry(x, k, s, p, d, ceil)
    table = Tensor.from_numpy(_flat_index(geom, x.shape[-1]), device=x.device)
    pick = indices.unsqueeze(-1) == table  # (N, C, OH, OW, K): which window slot the saved index names
    cot = where(pick, g.unsqueeze(-1), 0.0)
    return vjp1(lambda t: _windows(t, geom), x, cot)


@register(aten.avg_pool2d.default, supports=_pool4)
def avg_pool2d(
    x: Tensor, k: Any, s: Any = (), p: Any = 0, ceil: bool = False, cip: bool = True, div: int | None = None
) -> Tensor:
    return F.avg_pool2d(x, tuple(k), tuple(s) if s else None, tuple(p) if isinstance(p, list) else p, ceil, cip, div)


@register(aten.avg_pool2d_backward.default, supports=_pool4)
def avg_pool2d_backward(g: Tensor, x: Tensor, k: Any, s: Any, p: Any, ceil: bool, cip: bool, div: int | None) -> Tensor:
    return vjp1(lambda t: avg_pool2d(t, k, s, p, ceil, cip, div), x, g)


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x: Tensor, size: Any) -> Tensor:
    return F.adaptive_avg_pool2d(x, tuple(size))


@register(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(g: Tensor, x: Tensor) -> Tensor:
    return vjp1(lambda t: F.adaptive_avg_pool2d(t, g.shape[-2:]), x, g)


# ---------------------------------------------------------------- lookups and losses


@register(aten.embedding.default)
def embedding(w: Tensor, idx: Tensor, padding_idx: int = -1, scale_grad: bool = False, sparse: bool = False) -> Tensor:
    return F.embedding(idx, w)


@register(aten.embedding_dense_backward.default, supports=lambda n: not (len(n.args) > 4 and n.args[4]))
def embedding_backward(g: Tensor, idx: Tensor, num: int, padding_idx: int, scale_grad: bool) -> Tensor:
    flat = idx.reshape(-1)
    rows = g.reshape(-1, g.shape[-1])
    if padding_idx >= 0:
        rows = where((flat != padding_idx).unsqueeze(1).expand(*rows.shape), rows, 0.0)
    return Tensor(indexing.scatter_add_rows(rows.node, flat.node, num))


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


@register(aten.nll_loss_forward.default)
def nll_loss_forward(x: Tensor, t: Tensor, w: Tensor | None, reduction: int, ignore: int) -> tuple[Tensor, Tensor]:
    loss = F.nll_loss(x, t, w, ignore, _REDUCTIONS[reduction])
    valid = (t != ignore).astype(x.dtype)
    if w is not None:
        valid = valid * F.embedding(where(t == ignore, 0, t), w.reshape(-1, 1)).reshape(*t.shape)
    return loss, valid.sum()


@register(aten.nll_loss_backward.default)
def nll_loss_backward(
    g: Tensor, x: Tensor, t: Tensor, w: Tensor | None, reduction: int, ignore: int, total: Tensor
) -> Tensor:
    return vjp1(lambda a: F.nll_loss(a, t, w, ignore, _REDUCTIONS[reduction]), x, g)
