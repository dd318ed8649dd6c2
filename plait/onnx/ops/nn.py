"""Neural-network ONNX ops: Conv, ConvTranspose, pools, normalizations, Softmax family, Gemm, MatMul, Dropout,
LRN.

2-D convolutions go through plait.nn.functional.conv2d (im2col + GEMM); 1-D ones are 2-D with a unit axis.
Pools of any rank reduce strided window views: small windows as one fused elementwise chain, larger ones one spatial
axis at a time (max and sums are separable); asymmetric ONNX pads are applied explicitly.
"""

from __future__ import annotations

import functools
import math
import string
from typing import Any

import numpy as np

import plait.nn.functional as F
from plait import dtypes
from plait.frontends.native.tensor import Tensor, stack, where
from plait.graph.ops import pool
from plait.onnx.importer import Ctx
from plait.onnx.ops import register

# ---------------------------------------------------------------- padding rules


def _pads(ctx: Ctx, spatial: tuple[int, ...], kernel: list[int], strides: list[int], dil: list[int]) -> list[int]:
    """ONNX pads [b1, b2, ..., e1, e2, ...] after resolving auto_pad."""
    n = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for s, k, st, d in zip(spatial, kernel, strides, dil, strict=True):
            out = -(-s // st)
            total = max((out - 1) * st + (k - 1) * d + 1 - s, 0)
            small = total // 2
            begin.append(small if auto == "SAME_UPPER" else total - small)
            end.append(total - small if auto == "SAME_UPPER" else small)
        return begin + end
    if auto == "VALID":
        return [0] * (2 * n)
    return list(ctx.attr("pads", [0] * (2 * n)))


def _window_views(x: Tensor, kernel: list[int], strides: list[int], dil: list[int], out: list[int]) -> list[Tensor]:
    """Every kernel offset's strided view (N, C, *out) of an already padded input."""
    views = []
    for offs in np.ndindex(*kernel):
        key: list[slice] = [slice(None), slice(None)]
        for o, s, d, n in zip(offs, strides, dil, out, strict=True):
            start = o * d
            key.append(slice(start, start + (n - 1) * s + 1, s))
        views.append(x[tuple(key)])
    return views


def _out_len(size: int, k: int, s: int, d: int, b: int, e: int, ceil: bool) -> int:
    span = size + b + e - d * (k - 1) - 1
    if ceil:
        o = -(-span // s) + 1
        if (o - 1) * s >= size + b:
            o -= 1
        return o
    return span // s + 1


# ---------------------------------------------------------------- convolution


def _conv(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, w = ctx.t(ins[0]), ctx.t(ins[1])
    b = ctx.t(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    nsp = x.ndim - 2
    kernel = list(ctx.attr("kernel_shape", w.shape[2:]))
    strides = list(ctx.attr("strides", [1] * nsp))
    dil = list(ctx.attr("dilations", [1] * nsp))
    group = int(ctx.attr("group", 1))
    pads = _pads(ctx, x.shape[2:], kernel, strides, dil)
    if nsp == 1:
        x, w = x.unsqueeze(-1), w.unsqueeze(-1)
        strides, dil, pads = [*strides, 1], [*dil, 1], [pads[0], 0, pads[1], 0]
    elif nsp != 2:
        return _conv_nd(ctx, x, w, b, strides, dil, pads, group)
    if pads[0] == pads[2] and pads[1] == pads[3]:
        y = F.conv2d(x, w, b, tuple(strides), (pads[0], pads[1]), tuple(dil), group)
    else:
        xp = x.pad(((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        y = F.conv2d(xp, w, b, tuple(strides), 0, tuple(dil), group)
    return y.squeeze(-1) if nsp == 1 else y


def _conv_nd(
    ctx: Ctx, x: Tensor, w: Tensor, b: Tensor | None, strides: list[int], dil: list[int], pads: list[int], group: int
) -> Tensor:
    """Convolution of any rank as im2col + one batched GEMM over the groups."""
    nsp = x.ndim - 2
    n = x.shape[0]
    co, cg = w.shape[:2]
    kernel = list(w.shape[2:])
    xp = x.pad(((0, 0), (0, 0), *((pads[i], pads[i + nsp]) for i in range(nsp))))
    out = [_out_len(s, k, st, d, 0, 0, False) for s, k, st, d in zip(xp.shape[2:], kernel, strides, dil, strict=True)]
    views = _window_views(xp, kernel, strides, dil, out)
    kk = math.prod(kernel)
    patches = stack(views, 2)  # (N, C, K, *out)
    m = math.prod(out)
    cols = patches.reshape(n, group, cg * kk, m).permute(1, 2, 0, 3).reshape(group, cg * kk, n * m)
    y = (w.reshape(group, co // group, cg * kk) @ cols).reshape(co, n, *out).permute(1, 0, *range(2, nsp + 2))
    if b is not None:
        y = y + b.reshape(co, *([1] * nsp))
    return y


def _conv_transpose(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, w = ctx.t(ins[0]), ctx.t(ins[1])
    b = ctx.t(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    nsp = x.ndim - 2
    cin, cog = w.shape[:2]
    group = int(ctx.attr("group", 1))
    kernel = list(ctx.attr("kernel_shape", w.shape[2:]))
    strides = list(ctx.attr("strides", [1] * nsp))
    dil = list(ctx.attr("dilations", [1] * nsp))
    opad = list(ctx.attr("output_padding", [0] * nsp))
    in_sp = x.shape[2:]
    full = [
        s * (i - 1) + op + (k - 1) * d + 1 for i, s, op, k, d in zip(in_sp, strides, opad, kernel, dil, strict=True)
    ]
    out_shape = ctx.attr("output_shape")
    auto = ctx.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = (
            list(out_shape)[-nsp:] if out_shape is not None else [i * s for i, s in zip(in_sp, strides, strict=True)]
        )
        total = [f - t for f, t in zip(full, target, strict=True)]
        # the spec gives the smaller half to the start only for SAME_UPPER (NOTSET with output_shape included)
        if auto == "SAME_UPPER":
            pads = [t // 2 for t in total] + [t - t // 2 for t in total]
        else:
            pads = [t - t // 2 for t in total] + [t // 2 for t in total]
    else:
        pads = list(ctx.attr("pads", [0] * (2 * nsp)))
    # zero-stuff the input by the stride, pad by (k-1)*d - pad, then a stride-1 convolution with the flipped kernel
    y = x
    for a in range(nsp):
        s = strides[a]
        if s > 1:
            ax = 2 + a
            y = y.unsqueeze(ax + 1)
            y = y.pad([(0, 0)] * (ax + 1) + [(0, s - 1)] + [(0, 0)] * (y.ndim - ax - 2))
            shp = list(y.shape)
            y = y.reshape(*shp[:ax], shp[ax] * s, *shp[ax + 2 :])
            y = y[tuple(slice(None) if i != ax else slice(0, y.shape[ax] - (s - 1)) for i in range(y.ndim))]
    edge = [(k - 1) * d for k, d in zip(kernel, dil, strict=True)]
    spads = [(e - pads[a], e - pads[a + nsp] + opad[a]) for a, e in enumerate(edge)]
    y = y.pad([(0, 0), (0, 0), *spads])
    wf = w.flip(tuple(range(2, w.ndim)))
    wf = wf.reshape(group, cin // group, cog, *kernel).permute(0, 2, 1, *range(3, 3 + nsp))
    wf = wf.reshape(group * cog, cin // group, *kernel)
    if nsp == 2:
        return F.conv2d(y, wf, b, 1, 0, tuple(dil), group)
    return _conv_nd(ctx, y, wf, b, [1] * nsp, dil, [0] * (2 * nsp), group)


register("Conv", _conv)
register("ConvTranspose", _conv_transpose)

# ---------------------------------------------------------------- pooling


def _pool(ctx: Ctx, ins: list[Any], op: str, with_indices: bool = False) -> Any:
    x = ctx.t(ins[0])
    nsp = x.ndim - 2
    kernel = list(ctx.attr("kernel_shape"))
    strides = list(ctx.attr("strides", [1] * nsp))
    dil = list(ctx.attr("dilations", [1] * nsp))
    ceil = bool(ctx.attr("ceil_mode", 0))
    pads = _pads(ctx, x.shape[2:], kernel, strides, dil)
    sp = x.shape[2:]
    out = [
        _out_len(s, k, st, d, pads[i], pads[i + nsp], ceil)
        for i, (s, k, st, d) in enumerate(zip(sp, kernel, strides, dil, strict=True))
    ]
    extra = [
        max(0, (o - 1) * st + d * (k - 1) + 1 - (s + pads[i] + pads[i + nsp]))
        for i, (o, s, k, st, d) in enumerate(zip(out, sp, kernel, strides, dil, strict=True))
    ]
    if op == "max" and not with_indices and nsp == 2 and pool.supports(x.node):
        geo = pool.PoolGeometry(*x.shape[:2], *sp, *kernel, *strides, *pads[:2], *dil, *out)
        return Tensor(pool.max_pool2d(x.node, geo))
    fill = -math.inf if op == "max" else 0.0
    if not x.dtype.is_float and op == "max":
        fill = float(np.iinfo(x.dtype.np).min)
    box = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp] + extra[i]) for i in range(nsp)]
    xp = x.pad(box, fill) if any(a or b for a, b in box) else x
    if op == "max" and with_indices:
        return _max_with_indices(ctx, xp, sp, kernel, strides, dil, pads[:nsp], out)
    if op == "max":
        return _windows(xp, kernel, strides, dil, out, "max")
    if op == "lp":
        p = float(ctx.attr("p", 2))
        return _windows(xp.abs() ** p, kernel, strides, dil, out, "sum") ** (1.0 / p)
    total = _windows(xp, kernel, strides, dil, out, "sum")
    include = bool(ctx.attr("count_include_pad", 0))
    counts = _counts(sp, kernel, strides, dil, pads, out, include)
    if (counts == 1).all():
        # windows of one cell (torch exports AdaptiveAvgPool2d over a map already of the output size, as alexnet's
        # and vgg16's, as a 1x1 AveragePool): the pool is a view, not a division kernel between the last pool and
        # the classifier's GEMM
        return total
    return total / ctx.t(counts.astype(np.float32)).astype(x.dtype)


# windows of up to this many cells reduce as one elementwise chain over their strided views (one fused kernel, as
# plait.nn.functional's pools: resnet's 3x3/2 max pool took 9.5 ms as two separable reductions, 1.7 ms as a chain)
CHAIN_MAX_CELLS = 27


def _windows(x: Tensor, kernel: list[int], strides: list[int], dil: list[int], out: list[int], op: str) -> Tensor:
    """The max or sum of each window of a padded input: a chain of maximum/add over the windows' strided views for
    small windows, a separable reduction for larger ones."""
    if math.prod(kernel) > CHAIN_MAX_CELLS:
        return _separable(x, kernel, strides, dil, out, op)
    views = _window_views(x, kernel, strides, dil, out)
    return functools.reduce(Tensor.maximum if op == "max" else Tensor.__add__, views)


def _separable(x: Tensor, kernel: list[int], strides: list[int], dil: list[int], out: list[int], op: str) -> Tensor:
    """Reduce the windows of a padded input one spatial axis at a time (max and sum are separable): sum(kernel)
    strided views instead of prod(kernel), which keeps a 5x5x5 window's kernel source small and quick to build."""
    y = x
    for i, (k, s, d, n) in enumerate(zip(kernel, strides, dil, out, strict=True)):
        ax = 2 + i
        views = [y[(slice(None),) * ax + (slice(o * d, o * d + (n - 1) * s + 1, s),)] for o in range(k)]
        if k == 1:
            y = views[0]
            continue
        win = stack(views, -1)
        y = win.max(axis=-1) if op == "max" else win.sum(axis=-1)
    return y


def _max_with_indices(
    ctx: Ctx,
    xp: Tensor,
    sp: tuple[int, ...],
    kernel: list[int],
    strides: list[int],
    dil: list[int],
    begin: list[int],
    out: list[int],
) -> list[Tensor]:
    """Max pooling and MaxPool's Indices: the first maximum of each window, as a flat index into the unpadded
    input (row-major, or column-major over the spatial axes with storage_order=1), channels included."""
    win = stack(_window_views(xp, kernel, strides, dil, out), -1)
    first = win.argmax(-1, True).astype(dtypes.int64)
    offsets = list(np.ndindex(*kernel))
    grid = np.meshgrid(*[np.arange(n) for n in out], indexing="ij")
    order = range(len(sp) - 1, -1, -1) if ctx.attr("storage_order", 0) else range(len(sp))
    table = np.zeros((*out, len(offsets)), np.int64)
    for j, off in enumerate(offsets):
        flat = np.zeros(out, np.int64)
        for i in order:
            pos = np.clip(grid[i] * strides[i] - begin[i] + off[i] * dil[i], 0, sp[i] - 1)
            flat = flat * sp[i] + pos
        table[..., j] = flat
    pick = first == ctx.t(np.arange(len(offsets), dtype=np.int64))
    n, c = xp.shape[:2]
    base = (np.arange(n * c, dtype=np.int64) * math.prod(sp)).reshape(n, c, *([1] * len(sp)))
    idx = where(pick, ctx.t(table), 0).sum(-1) + ctx.t(base)
    return [win.max(axis=-1), idx]


def _counts(
    sp: tuple[int, ...],
    kernel: list[int],
    strides: list[int],
    dil: list[int],
    pads: list[int],
    out: list[int],
    include: bool,
) -> np.ndarray:
    """How many cells each average-pool window averages: inside the input, or inside input + explicit pads."""
    nsp = len(sp)
    total = np.ones(out)
    for i in range(nsp):
        lo, hi = (-pads[i], sp[i] + pads[i + nsp]) if include else (0, sp[i])
        pos = np.arange(out[i])[:, None] * strides[i] - pads[i] + np.arange(kernel[i])[None, :] * dil[i]
        cnt = ((pos >= lo) & (pos < hi)).sum(axis=1)
        total = total * cnt.reshape([-1 if j == i else 1 for j in range(nsp)])
    return np.maximum(total, 1)


register("MaxPool", lambda ctx, ins: _maxpool(ctx, ins))
register("AveragePool", lambda ctx, ins: _pool(ctx, ins, "avg"))
register("LpPool", lambda ctx, ins: _pool(ctx, ins, "lp"))


def _maxpool(ctx: Ctx, ins: list[Any]) -> Any:
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        return _pool(ctx, ins, "max", with_indices=True)
    return _pool(ctx, ins, "max")


def _global(op: str) -> Any:
    def fn(ctx: Ctx, ins: list[Any]) -> Tensor:
        x = ctx.t(ins[0])
        axes = tuple(range(2, x.ndim))
        if op == "max":
            return x.max(axes, True)
        if op == "lp":
            p = float(ctx.attr("p", 2))
            return (x.abs() ** p).sum(axes, True) ** (1.0 / p)
        return x.mean(axes, True)

    return fn


register("GlobalAveragePool", _global("avg"))
register("GlobalMaxPool", _global("max"))
register("GlobalLpPool", _global("lp"))

# ---------------------------------------------------------------- normalization


def _channel(t: Tensor, nd: int) -> Tensor:
    return t.reshape(t.shape[0], *([1] * (nd - 2)))


def _batchnorm(ctx: Ctx, ins: list[Any]) -> Any:
    if ctx.attr("training_mode", 0) or len([o for o in ctx.node.output if o]) > 1:
        return _batchnorm_training(ctx, ins)
    x = ctx.t(ins[0])
    eps = float(ctx.attr("epsilon", 1e-5))
    scale, bias, mean, var = ins[1:5]
    if all(isinstance(v, np.ndarray) for v in (scale, bias, mean, var)):
        # fold into one multiply-add on the host (inference BN is affine)
        k = (scale / np.sqrt(var.astype(np.float64) + eps)).astype(np.float32)
        c = (bias - mean * k).astype(np.float32)
        return x * _channel(ctx.t(k), x.ndim).astype(x.dtype) + _channel(ctx.t(c), x.ndim).astype(x.dtype)
    s, b_, m, v = (_channel(ctx.t(t), x.ndim) for t in (scale, bias, mean, var))
    return (x - m) / (v + eps).sqrt() * s + b_


def _batchnorm_training(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    """Training mode: normalise by the batch's statistics (biased variance) and blend them into the running ones
    with `momentum`. Opsets 14+ return (Y, running_mean, running_var); older ones also the batch mean and
    variance."""
    x = ctx.t(ins[0])
    eps = float(ctx.attr("epsilon", 1e-5))
    mom = float(ctx.attr("momentum", 0.9))
    axes = (0, *range(2, x.ndim))
    xf = x.astype(dtypes.float32)
    mean = xf.mean(axes)
    var = ((xf - _channel(mean, x.ndim)) ** 2.0).mean(axes)
    s, b_ = (_channel(ctx.t(t).astype(dtypes.float32), x.ndim) for t in ins[1:3])
    y = (xf - _channel(mean, x.ndim)) / _channel(var + eps, x.ndim).sqrt() * s + b_
    run_mean = ctx.t(ins[3]).astype(dtypes.float32) * mom + mean * (1.0 - mom)
    run_var = ctx.t(ins[4]).astype(dtypes.float32) * mom + var * (1.0 - mom)
    outs = [y, run_mean, run_var] + ([] if ctx.opset >= 14 else [mean, var])
    return [o.astype(x.dtype) for o in outs]


def _instancenorm(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    eps = float(ctx.attr("epsilon", 1e-5))
    axes = tuple(range(2, x.ndim))
    mean = x.mean(axes, True)
    var = ((x - mean) ** 2.0).mean(axes, True)
    y = (x - mean) / (var + eps).sqrt()
    return y * _channel(ctx.t(ins[1]), x.ndim) + _channel(ctx.t(ins[2]), x.ndim)


def _layernorm(ctx: Ctx, ins: list[Any]) -> Any:
    x = ctx.t(ins[0])
    a = int(ctx.attr("axis", -1)) % x.ndim
    eps = float(ctx.attr("epsilon", 1e-5))
    axes = tuple(range(a, x.ndim))
    xf = x.astype(dtypes.float32)
    mean = xf.mean(axes, True)
    d = xf - mean
    var = (d * d).mean(axes, True)
    inv = (var + eps).sqrt().reciprocal()
    y = (d * inv).astype(x.dtype) * ctx.t(ins[1])
    if len(ins) > 2 and ins[2] is not None:
        y = y + ctx.t(ins[2])
    return [y, mean, inv]


def _rmsnorm(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    a = int(ctx.attr("axis", -1)) % x.ndim
    eps = float(ctx.attr("epsilon", 1e-5))
    xf = x.astype(dtypes.float32)
    ms = (xf * xf).mean(tuple(range(a, x.ndim)), True)
    return (xf / (ms + eps).sqrt()).astype(x.dtype) * ctx.t(ins[1])


def _groupnorm(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    g = int(ctx.attr("num_groups"))
    eps = float(ctx.attr("epsilon", 1e-5))
    n, c = x.shape[:2]
    xg = x.reshape(n, g, -1)
    mean = xg.mean(2, True)
    var = ((xg - mean) ** 2.0).mean(2, True)
    y = ((xg - mean) / (var + eps).sqrt()).reshape(*x.shape)
    scale, bias = ctx.t(ins[1]), ctx.t(ins[2])
    if ctx.opset < 21 and scale.shape[0] == g and g != c:
        scale = scale.reshape(g, 1).expand(g, c // g).reshape(c)
        bias = bias.reshape(g, 1).expand(g, c // g).reshape(c)
    return y * _channel(scale, x.ndim) + _channel(bias, x.ndim)


def _lrn(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    sq = x * x
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sqp = sq.pad([(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
    c = x.shape[1]
    acc = sqp[:, 0:c]
    for i in range(1, size):
        acc = acc + sqp[:, i : i + c]
    return x / (acc * (alpha / size) + bias) ** beta


def _lpnorm(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    a = int(ctx.attr("axis", -1)) % x.ndim
    p = int(ctx.attr("p", 2))
    norm = x.abs().sum(a, True) if p == 1 else (x * x).sum(a, True).sqrt()
    return where(norm == 0, 0.0, x / where(norm == 0, 1.0, norm))


def _mvn(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    axes = tuple(a % x.ndim for a in ctx.attr("axes", [0, 2, 3]))
    mean = x.mean(axes, True)
    var = ((x - mean) ** 2.0).mean(axes, True)
    return (x - mean) / (var.sqrt() + 1e-9)


register("BatchNormalization", _batchnorm)
register("InstanceNormalization", _instancenorm)
register("LayerNormalization", _layernorm)
register("RMSNormalization", _rmsnorm)
register("GroupNormalization", _groupnorm)
register("LRN", _lrn)
register("LpNormalization", _lpnorm)
register("MeanVarianceNormalization", _mvn)

# ---------------------------------------------------------------- softmax family


def _softmax_like(kind: str) -> Any:
    def fn(ctx: Ctx, ins: list[Any]) -> Tensor:
        x = ctx.t(ins[0])
        if x.ndim == 0:
            x = x.reshape(1)
        if ctx.opset < 13:
            a = int(ctx.attr("axis", 1)) % x.ndim
            flat = x.reshape(math.prod(x.shape[:a]), -1)
            return _apply(kind, flat, 1).reshape(*x.shape)
        return _apply(kind, x, int(ctx.attr("axis", -1)) % x.ndim)

    return fn


def _apply(kind: str, x: Tensor, a: int) -> Tensor:
    if kind == "softmax":
        return F.softmax(x, a)
    if kind == "logsoftmax":
        return F.log_softmax(x, a)
    first = x.argmax(a, True)
    idx = Tensor.arange(x.shape[a], device=x.device).reshape(*[-1 if i == a else 1 for i in range(x.ndim)])
    return (idx == first).astype(x.dtype)


register("Softmax", _softmax_like("softmax"))
register("LogSoftmax", _softmax_like("logsoftmax"))
register("Hardmax", _softmax_like("hardmax"))

# ---------------------------------------------------------------- products


def _matmul(ctx: Ctx, ins: list[Any]) -> Tensor:
    a, b = ctx.t(ins[0]), ctx.t(ins[1])
    return a @ b


def _gemm(ctx: Ctx, ins: list[Any]) -> Tensor:
    a, b = ctx.t(ins[0]), ctx.t(ins[1])
    if ctx.attr("transA", 0):
        a = a.T
    # transB (a linear layer's (out, in) weight) stays a transposed view, as plait.nn.functional.linear reads it:
    # the product kernels stream such a B along K (cpu GEMV over a 4096x25088 weight: 98 ms instead of 130 ms at
    # batch 16 when it was transposed on the host into (in, out))
    y = a @ (b.T if ctx.attr("transB", 0) else b)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    if len(ins) > 2 and ins[2] is not None:
        c = ctx.t(ins[2]).astype(y.dtype)
        y = y + (c * beta if beta != 1.0 else c)
    return y


register("MatMul", _matmul)
register("Gemm", _gemm)


def _einsum(ctx: Ctx, ins: list[Any]) -> Tensor:
    """Einsum as one broadcast multiply and a sum. An ellipsis stands for fresh letters (right-aligned across
    operands, as in NumPy); a letter repeated within one operand takes that operand's diagonal first."""
    eq = str(ctx.attr("equation")).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ts = [ctx.t(x) for x in ins]
    terms = lhs.split(",")
    if len(terms) != len(ts):
        raise ctx.error(f"Einsum equation {eq!r} names {len(terms)} operands, the node has {len(ts)}")
    spare = [c for c in string.ascii_letters if c not in eq]
    ranks = [t.ndim - len(term.replace("...", "")) for term, t in zip(terms, ts, strict=True) if "..." in term]
    ell = spare[: max(ranks, default=0)]
    terms = [
        term.replace("...", "".join(ell[len(ell) - (t.ndim - len(term) + 3) :])) if "..." in term else term
        for term, t in zip(terms, ts, strict=True)
    ]
    if arrow:
        rhs = rhs.replace("...", "".join(ell))
    else:
        flat = "".join(terms)
        rhs = "".join(ell) + "".join(sorted(c for c in set(flat) - set(ell) if flat.count(c) == 1))
    for n, (term, t) in enumerate(zip(terms, ts, strict=True)):
        terms[n], ts[n] = _diagonals(ctx, term, t)
    letters = list(rhs) + sorted(set("".join(terms)) - set(rhs))
    sizes: dict[str, int] = {}
    aligned = []
    for term, t in zip(terms, ts, strict=True):
        for c, s in zip(term, t.shape, strict=True):
            sizes[c] = max(sizes.get(c, 1), s)
        perm = [term.index(c) for c in letters if c in term]
        t = t.permute(*perm)
        shape = [t.shape[[c for c in letters if c in term].index(c)] if c in term else 1 for c in letters]
        aligned.append(t.reshape(*shape))
    prod = aligned[0]
    for t in aligned[1:]:
        prod = prod * t
    red = tuple(range(len(rhs), len(letters)))
    out = prod.sum(red) if red else prod
    return out.expand(*(sizes[c] for c in rhs)) if rhs else out


def _diagonals(ctx: Ctx, term: str, t: Tensor) -> tuple[str, Tensor]:
    """Collapse each letter repeated within one operand to its diagonal: multiply by an identity mask over the two
    axes and sum the second away."""
    if len(term) != t.ndim:
        raise ctx.error(f"Einsum operand {term!r} does not match an input of rank {t.ndim}")
    while len(set(term)) != len(term):
        c = next(ch for ch in term if term.count(ch) > 1)
        i, j = term.index(c), term.index(c, term.index(c) + 1)
        n = t.shape[i]
        shape = [1] * t.ndim
        shape[i], shape[j] = n, n
        eye = ctx.t(np.eye(n).reshape(shape).astype(t.dtype.np))
        t = (t * eye).sum(j)
        term = term[:j] + term[j + 1 :]
    return term, t


register("Einsum", _einsum)


def _dropout(ctx: Ctx, ins: list[Any]) -> Any:
    x = ins[0]
    if ctx.opset >= 12 and len(ins) > 2 and ins[2] is not None and bool(ctx.host(ins[2], "training_mode")):
        ratio = float(ctx.host(ins[1], "ratio")) if len(ins) > 1 and ins[1] is not None else 0.5
        if ratio != 0.0:
            raise ctx.unsupported("Dropout in training mode is not supported (inference only)")
    mask = np.ones(tuple(x.shape), dtype=np.bool_)
    return [x, mask]


register("Dropout", _dropout)
