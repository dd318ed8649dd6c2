"""Neural-network functions on plait.Tensor with torch.nn.functional's names, signatures and defaults.

Every function builds lazy graph nodes, so forward and backward compile into fused kernels like any other
plait code. Convolution is im2col (pad + strided shrink views) feeding one GEMM; pooling is strided views plus
a reduction; lookups go through the gather/scatter-add ops in plait.graph.ops.indexing.

>>> import plait, plait.nn.functional as F
>>> x = plait.tensor([[-1.0, 2.0]], device="cpu")
>>> F.relu(x).numpy().tolist()
[[0.0, 2.0]]
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from plait import dtypes
from plait.errors import DTypeError, PlaitError, ShapeError, UnsupportedError
from plait.frontends.native.tensor import Tensor, cat, stack, where
from plait.graph.autodiff import custom_vjp, grad_enabled, no_grad
from plait.graph.node import Node
from plait.graph.ops import (
    bnstat_c,
    conv_wgrad_c,
    depthwise_cl,
    depthwise_grad_c,
    indexing,
    pool,
    pool_cl,
    pool_grad,
)
from plait.graph.ops import elementwise as ew
from plait.graph.ops.conv import Window, im2col
from plait.graph.ops.winograd_cl import wgrad_plan, winograd_cl_wgrad
from plait.schedule.plan import capturing

IntPair = int | Sequence[int]

__all__ = [
    "adaptive_avg_pool2d",
    "avg_pool2d",
    "batch_norm",
    "binary_cross_entropy_with_logits",
    "conv2d",
    "cross_entropy",
    "dropout",
    "elu",
    "embedding",
    "flatten",
    "gelu",
    "group_norm",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "interpolate",
    "layer_norm",
    "leaky_relu",
    "linear",
    "log_softmax",
    "max_pool2d",
    "mse_loss",
    "nll_loss",
    "one_hot",
    "pad",
    "relu",
    "relu6",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "softmax",
    "tanh",
    "upsample",
]


def _pair(v: IntPair, name: str) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    t = tuple(int(a) for a in v)
    if len(t) == 1:
        return t[0], t[0]
    if len(t) != 2:
        raise ShapeError(f"{name}: expected an int or a pair, got {v!r}")
    return t[0], t[1]


def _need_float(x: Tensor, op: str) -> None:
    if not x.dtype.is_float:
        raise DTypeError(f"{op}: needs a floating-point input, got {x.dtype.name} with shape {x.shape}; cast it first")


def _need_ndim(x: Tensor, ndims: Sequence[int], op: str, what: str) -> None:
    if x.ndim not in ndims:
        raise ShapeError(f"{op}: expected a {what} input, got shape {x.shape}")


def _detached(fn: Any, *args: Any, **kw: Any) -> Tensor:
    """Build `fn(...)` without recording history (a lazy stop-gradient; nothing is computed here)."""
    with no_grad():
        out: Tensor = fn(*args, **kw)
    return out


def stop_gradient(x: Tensor) -> Tensor:
    """The same values as x, but backward does not flow through (lazy, unlike detach(), which computes x)."""
    return _detached(lambda: x * 1.0)


# ---------------------------------------------------------------- activations


def relu(x: Tensor, inplace: bool = False) -> Tensor:
    return x.relu()


def relu6(x: Tensor, inplace: bool = False) -> Tensor:
    return hardtanh(x, 0.0, 6.0)


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    # selects keep torch's gradient convention at the edges (zero outside the open interval) and let NaN through
    return where(x <= min_val, min_val, where(x >= max_val, max_val, x))


def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    return where(x > 0, x, x * negative_slope)


def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    return where(x > 0, x, (x.minimum(0.0).exp() - 1.0) * alpha)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (inner.tanh() + 1.0)
    if approximate != "none":
        raise UnsupportedError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * 0.5 * ((x * (1.0 / math.sqrt(2.0))).erf() + 1.0)


def sigmoid(x: Tensor) -> Tensor:
    return x.sigmoid()


def tanh(x: Tensor) -> Tensor:
    return x.tanh()


def silu(x: Tensor, inplace: bool = False) -> Tensor:
    return x * x.sigmoid()


def hardsigmoid(x: Tensor, inplace: bool = False) -> Tensor:
    inside = (x > -3.0) & (x < 3.0)
    return where(inside, x * (1.0 / 6.0) + 0.5, where(x <= -3.0, 0.0, 1.0).astype(x.dtype))


def hardswish(x: Tensor, inplace: bool = False) -> Tensor:
    # torch's gradient: 0 below -3, 1 above 3, x/3 + 0.5 between (both edges belong to the outer pieces)
    mid = x * (x + 3.0) * (1.0 / 6.0)
    return where(x < -3.0, x * 0.0, where(x > 3.0, x, mid))


def softmax(x: Tensor, dim: int = -1, dtype: Any = None) -> Tensor:
    x = x.astype(dtype) if dtype is not None else x
    _need_float(x, "softmax")
    m = _detached(lambda: x.max(axis=dim, keepdims=True))
    e = (x - m).exp()
    return e / e.sum(axis=dim, keepdims=True)


def log_softmax(x: Tensor, dim: int = -1, dtype: Any = None) -> Tensor:
    x = x.astype(dtype) if dtype is not None else x
    _need_float(x, "log_softmax")
    m = _detached(lambda: x.max(axis=dim, keepdims=True))
    s = x - m
    return s - s.exp().sum(axis=dim, keepdims=True).log()


# ---------------------------------------------------------------- linear and convolution


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y = x @ weight.T + bias, with weight of shape (out_features, in_features)."""
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(
            f"linear: input shape {x.shape} does not match weight shape {weight.shape} "
            f"(the input's last dim must equal in_features={weight.shape[-1] if weight.ndim else '?'})"
        )
    if x.dtype != weight.dtype:
        raise DTypeError(f"linear: input dtype {x.dtype.name} differs from weight dtype {weight.dtype.name}; cast one")
    lead = x.shape[:-1]
    rows = x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
    y = rows @ weight.T
    if grad_enabled() and (x.requires_grad or weight.requires_grad) and x.node.device.startswith("opencl"):
        _linear_vjp(y, rows, weight)
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, weight.shape[0]) if x.ndim != 2 else y


def _linear_vjp(y: Tensor, rows: Tensor, weight: Tensor) -> None:
    """The gradients of `y` = rows @ weight^T on OpenCL as two products in the layouts the caller keeps: the input's
    dy @ weight (the stored weight read in place) and the weight's dy^T @ rows, written as (out, in). Op by op the
    weight's gradient is rows^T @ dy, an (in, out) product then transposed into the weight's layout by a strided
    copy: alexnet's classifier at batch 64 on an H100 spent 0.50 ms per step in those copies (4096 x 9216 alone
    0.32 ms) beside 0.37 ms in its three weight-gradient products."""
    rows_node, w_node = rows.node, weight.node

    def rule(grad: Node) -> list[tuple[Node, Node]]:
        dy = Tensor(grad)
        grads = []
        if rows_node.rg:
            grads.append((rows_node, (dy @ Tensor(w_node)).node))
        if w_node.rg:
            grads.append((w_node, (dy.T @ Tensor(rows_node)).node))
        return grads

    custom_vjp(y.node, rule)


def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float = 0.0) -> Tensor:
    """torch.nn.functional.pad: `pad` lists (before, after) pairs starting from the LAST axis."""
    if mode != "constant":
        raise UnsupportedError(f"pad: mode {mode!r} is not supported (only 'constant')")
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ShapeError(f"pad: {list(pad)} must hold (before, after) pairs for at most {x.ndim} axes of {x.shape}")
    pairs = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        pairs[x.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    return x.pad(pairs, value)


def _windows(
    x: Tensor, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int], out_hw: tuple[int, int]
) -> list[Tensor]:
    """The kh*kw strided views (N, C, OH, OW) of an already padded (N, C, H, W) input, row-major over the kernel."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, stride, dilation, out_hw
    views = []
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * dh, j * dw
            views.append(x[:, :, y0 : y0 + (oh - 1) * sh + 1 : sh, x0 : x0 + (ow - 1) * sw + 1 : sw])
    return views


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool = False) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    if ceil_mode:
        o = -(-span // s) + 1
        if (o - 1) * s >= size + p:  # the last window must start inside the input or its left padding
            o -= 1
        return o
    return span // s + 1


def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: IntPair = 1,
    padding: IntPair | str = 0,
    dilation: IntPair = 1,
    groups: int = 1,
) -> Tensor:
    """2-D cross-correlation of an (N, C, H, W) input with a (Co, C/groups, kh, kw) weight, as im2col + GEMM in
    the graph; where the im2col has no other reader (inference), the scheduler lets the GEMM gather the patches
    from the image itself, so no patch buffer is made (schedule/scheduler.py, `_implicit_conv`)."""
    _need_ndim(x, (3, 4), "conv2d", "(N, C, H, W) or (C, H, W)")
    if x.ndim == 3:
        return conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0)
    if weight.ndim != 4:
        raise ShapeError(f"conv2d: weight must be (out_channels, in_channels/groups, kh, kw), got {weight.shape}")
    if x.dtype != weight.dtype:
        raise DTypeError(f"conv2d: input dtype {x.dtype.name} differs from weight dtype {weight.dtype.name}; cast one")
    n, c, h, w = x.shape
    co, cg, kh, kw = weight.shape
    if groups < 1 or c % groups or co % groups or cg * groups != c:
        raise ShapeError(
            f"conv2d: input with {c} channels (shape {x.shape}) does not fit weight {weight.shape} with groups={groups}"
            f" (need in_channels == weight.shape[1] * groups and out_channels divisible by groups)"
        )
    (sh, sw), (dh, dw) = _pair(stride, "conv2d stride"), _pair(dilation, "conv2d dilation")
    if isinstance(padding, str):
        if padding == "valid":
            ph = pw = 0
        elif padding == "same" and sh == sw == 1:
            ph, pw = dh * (kh - 1) // 2, dw * (kw - 1) // 2
            if (dh * (kh - 1)) % 2 or (dw * (kw - 1)) % 2:
                raise UnsupportedError("conv2d: padding='same' with an even effective kernel size is not supported")
        else:
            raise UnsupportedError(f"conv2d: padding={padding!r} is not supported (use ints, 'valid' or 'same')")
    else:
        ph, pw = _pair(padding, "conv2d padding")
    oh, ow = _out_size(h, kh, sh, ph, dh), _out_size(w, kw, sw, pw, dw)
    if oh < 1 or ow < 1:
        raise ShapeError(f"conv2d: input {x.shape} is too small for kernel {(kh, kw)} with padding {(ph, pw)}")
    g, k = groups, cg * kh * kw
    geo = Window(n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw)
    recording = grad_enabled() and (x.requires_grad or weight.requires_grad)
    # the cpu's weight gradient reads dy and gathers x itself (conv_wgrad_c): no patch columns to share with the
    # forward, which then runs per image as at inference (implicit GEMM or Winograd, gathering from the image)
    direct_w = recording and weight.requires_grad and g == 1 and conv_wgrad_c.supports(x.node, geo)
    direct_w = direct_w and conv_wgrad_c.wins(geo)
    folded = recording and co // g >= FOLD_MIN_ROWS and not direct_w
    if folded:
        out, cols = _conv2d_folded(x, weight, dataclasses.replace(geo, fold=True), g)
    else:
        if (kh, kw, sh, sw, ph, pw) == (1, 1, 1, 1, 0, 0):
            cols = x.reshape(n, g, k, h * w)
        else:
            # implicit-GEMM operand: patch columns (N, C*kh*kw, OH*OW) from one im2col kernel (its gradient is col2im)
            cols = Tensor(im2col(x.node, geo)).reshape(n, g, k, oh * ow)
        # one batched GEMM over (image, group), the weight broadcast over images; the product is already NCHW, so
        # bias, batch norm and activations that follow fuse into the GEMM's epilogue
        out = (weight.reshape(1, g, co // g, k) @ cols).reshape(n, co, oh, ow)
    if recording:
        transposed = (sh, sw) == (1, 1) and (kh, kw) != (1, 1) and ph <= dh * (kh - 1) and pw <= dw * (kw - 1)
        _conv_vjp(out, x, weight, cols, geo, g, folded, transposed, direct_w)
    if bias is not None:
        out = out + bias.reshape(co, 1, 1)
    return out


# a product with fewer rows per group (depthwise convolutions) keeps the per-image form: folded, its weight
# gradient would be a few outputs with a K of every image's positions, which no GEMM template spreads over a device
FOLD_MIN_ROWS = 16


# output positions per image from which a cpu training convolution's forward runs per image (see below)
PER_IMAGE_MIN_POSITIONS = 128


def _forward_per_image(x: Tensor, win: Window, g: int, co: int) -> bool:
    """Whether a training convolution's forward (`co` output channels) runs per image as at inference (implicit GEMM
    or Winograd F(4,3), gathering from the image) rather than as the folded product over the patch columns. On the
    cpu, for 3x3 stride-1 convolutions with at least PER_IMAGE_MIN_POSITIONS output positions per image, one thread:
    cifar_cnn's 32x32 layer 6.4 against 9.0 ms, resnet18's 56x56 layer 47 against 75 ms, 14x14 44 against 54; at 7x7
    and 8x8 the folded product is as fast as the implicit GEMM or faster (docs/benchmarks.md, "cpu training step:
    forward per image"), but not as Winograd with its weight transformed per call, which takes smaller planes from
    winograd_c.PER_CALL_MIN_POSITIONS over the batch (resnet18 b16 layer4, one thread: three forwards 150 against
    about 128 ms with the transforms, "cpu training step: layer4 by Winograd"). The input gradient must not go
    through the columns (the `transposed` form of `_conv_vjp`), so the padding stays within the kernel's reach. A
    first layer's few input channels (K = 27) keep the folded product, 0.7 against 0.85 ms."""
    from plait.codegen import winograd_c  # here: at module level it would import the codegen before the op table

    winograd = (
        win.n * win.oh * win.ow >= winograd_c.PER_CALL_MIN_POSITIONS and min(win.c, co) >= winograd_c.MIN_CHANNELS
    )
    return (
        x.node.device.startswith("cpu")
        and g == 1
        and win.c >= 16
        and (win.kh, win.kw, win.sh, win.sw, win.dh, win.dw) == (3, 3, 1, 1, 1, 1)
        and win.ph <= 2
        and win.pw <= 2
        and (win.oh * win.ow >= PER_IMAGE_MIN_POSITIONS or winograd)
    )


def _conv2d_folded(x: Tensor, weight: Tensor, win: Window, g: int) -> tuple[Tensor, Tensor]:
    """A convolution whose gradient is recorded, with the batch folded into the GEMM's columns: the patch columns
    laid out (C*kh*kw, N, OH*OW), the forward one GEMM per group (N = images x positions), the weight gradient one
    GEMM with K = images x positions (no product per image summed afterwards) and the input gradient one GEMM
    followed by col2im. The product comes out (Co, N, OH*OW) and is read as NCHW through a permute, which the
    batch-norm reductions that usually follow read channel by channel. Returns the output and the columns."""
    n, co, k = win.n, weight.shape[0], win.c // g * win.kh * win.kw
    p = win.oh * win.ow
    if (win.kh, win.kw, win.sh, win.sw, win.ph, win.pw) == (1, 1, 1, 1, 0, 0):
        cols = x.reshape(n, g, k, p).permute(1, 2, 0, 3).reshape(g, k, n * p)
    else:
        cols = Tensor(im2col(x.node, win)).reshape(g, k, n * p)
    if _forward_per_image(x, win, g, co):
        # a second im2col node whose only reader is the product: the scheduler gathers its patches from the image
        # (or runs Winograd); the folded columns above then feed only the weight gradient
        image_cols = Tensor(im2col(x.node, dataclasses.replace(win, fold=False))).reshape(n, 1, k, p)
        return (weight.reshape(1, 1, co, k) @ image_cols).reshape(n, co, win.oh, win.ow), cols
    out = weight.reshape(g, co // g, k) @ cols
    return out.reshape(co, n, win.oh, win.ow).permute(1, 0, 2, 3), cols


def _conv_vjp(
    out: Tensor,
    x: Tensor,
    weight: Tensor,
    cols: Tensor,
    win: Window,
    g: int,
    folded: bool,
    transposed: bool,
    direct_w: bool = False,
) -> None:
    """The gradient of a convolution `out` = weight @ `cols` (patch columns of x), in the cheaper of the forms the
    op-by-op gradient would not pick:

    - input (`transposed`, stride 1): the gradient of `out` convolved with the weight flipped in space and with its
      channel axes swapped, padded by dilation*(k-1) - padding. Op by op it is a GEMM writing a column per kernel
      tap (kh*kw times the input) and a col2im summing them; as a convolution it is one implicit GEMM (or Winograd
      for 3x3) that reads the gradient in place and writes the input's shape. Otherwise the columns' gradient
      weight^T @ dy, handed to the columns (col2im or the 1x1 view's inverse follow op by op).
    - weight, folded: (columns @ dy^T)^T. Op by op it is dy @ columns^T, whose GEMM packs the columns (C*kh*kw x
      images*positions, the large operand) to reuse each value only Co times; the other way round the GEMM reads
      the columns in place and packs dy. 1.1-1.5x faster on one thread for cifar_cnn's and resnet18's layers
      (docs/benchmarks.md, "cpu training step: convolution gradients").
    - depthwise (one filter per channel) on OpenCL: the weight gradient one direct kernel reading dy and x (no
      patch columns, so the forward gathers its patches from the image), and a strided input gradient a direct
      gather (plait/graph/ops/depthwise_cl.py); on the cpu the column form measured faster.
    - depthwise on the cpu: the weight gradient one C kernel that dots dy's rows with the input rows each tap reads
      (plait/graph/ops/depthwise_grad_c.py), so no patch columns are made and the forward gathers from the image.
    - `direct_w` (the cpu, no groups): the weight gradient one C kernel that reads dy in place and gathers the patch
      rows of x itself (plait/graph/ops/conv_wgrad_c.py), so neither the columns nor dy's (N*P, Co) copy are made.
    """
    co, cg, kh, kw = weight.shape
    n, c, _, _ = x.shape
    ph, pw, dh, dw = win.ph, win.pw, win.dh, win.dw
    p = out.shape[2] * out.shape[3]
    direct = g == c == co and x.node.device.startswith("opencl") and depthwise_cl.supports(win)
    direct_c = g == c == co and depthwise_grad_c.supports(x.node, win)
    # OpenCL: a 1x1 stride-1 convolution's input gradient is the 1x1 convolution of dy with the weight transposed,
    # one product per image reading dy and writing the input's NCHW shape in place, instead of a folded product
    # into the (C, N*P) columns' layout that then also needs dy copied into that layout (resnet50 b64's 1x1 layers).
    # The columns are then views of x, which must be x's own (a reshape of a reshape skips x: a max pool's output),
    # since the rule's contributions reach only ancestors of `out`
    pointwise = (kh, kw, win.sh, win.sw, ph, pw, dh, dw) == (1, 1, 1, 1, 0, 0, 1, 1)
    pointwise = pointwise and folded and g == 1 and x.node.device.startswith("opencl") and _views_of(cols.node, x.node)
    transposed = transposed or pointwise
    # OpenCL: a float32 3x3 (5x5) stride-1 weight gradient by Winograd F(2,3) (F(2,5)) where `wgrad_plan` picks it
    on_cl = folded and g == 1 and x.node.device.startswith("opencl") and weight.requires_grad
    on_cl = on_cl and x.node.dtype == dtypes.float32
    wino_w = wgrad_plan(win, co) if on_cl else None
    # the rule keeps nodes, not Tensors: a live Tensor marks its value as one the caller can read, which a plan
    # then may not reuse (plait/schedule/plan.py, `held`); the patch columns are only the weight gradient's
    x_node, cols_node, w_node = x.node, cols.node, weight.node

    def rule(grad: Node) -> list[tuple[Node, Node]]:
        gout, w, cols_t = Tensor(grad), Tensor(w_node), Tensor(cols_node)
        dy = gout.permute(1, 0, 2, 3).reshape(g, co // g, n * p) if folded else gout.reshape(n, g, co // g, p)
        grads = []
        if x_node.rg and transposed:
            # copied by an elementwise pass: a flip is no strided view, and as one contiguous buffer the weight is
            # read in place by the GEMM (and by Winograd's transform) instead of being expanded over the batch first
            flipped = w.reshape(g, co // g, cg, kh, kw).permute(0, 2, 1, 3, 4).flip((3, 4)) * 1.0
            dx = conv2d(gout, flipped.reshape(c, co // g, kh, kw), None, 1, (dh * (kh - 1) - ph, dw * (kw - 1) - pw),
                        (dh, dw), g)  # fmt: skip
            grads.append((x_node, dx.node))
        elif x_node.rg and direct:
            grads.append((x_node, depthwise_cl.depthwise_dgrad_cl(grad, w_node, win)))
        elif x_node.rg:
            wt = w.reshape(g, co // g, cg * kh * kw).transpose(-1, -2)
            grads.append((cols_node, (wt @ dy if folded else wt.reshape(1, *wt.shape) @ dy).node))
        if w_node.rg and direct:
            grads.append((w_node, depthwise_cl.depthwise_wgrad_cl(grad, x_node, win)))
        elif w_node.rg and direct_c:
            grads.append((w_node, depthwise_grad_c.depthwise_wgrad_c(grad, x_node, win)))
        elif w_node.rg and direct_w:
            grads.append((w_node, conv_wgrad_c.conv_wgrad_c(grad, x_node, win)))
        elif w_node.rg and wino_w is not None:
            grads.append((w_node, winograd_cl_wgrad(grad, x_node, wino_w)))
        elif w_node.rg:
            if folded and x_node.device.startswith("cpu") and co * cg * kh * kw >= WGRAD_PLAIN_MIN:
                # a large weight's (C*kh*kw, Co) product, transposed into the weight's layout afterwards, costs a
                # slow strided copy (25 ms of resnet18's 512x4608 on one thread); dy @ columns^T is written in place
                wgrad = dy @ cols_t.transpose(-1, -2)
            elif folded:
                wgrad = (cols_t @ dy.transpose(-1, -2)).transpose(-1, -2)
            else:
                wgrad = (dy @ cols_t.transpose(-1, -2)).sum(axis=0)
            grads.append((w_node, wgrad.reshape(co, cg, kh, kw).node))
        return grads

    custom_vjp(out.node, rule)


def _views_of(node: Node, x: Node) -> bool:
    """True when `node` is `x` seen through movement ops, each reading the one before (x stays in the graph)."""
    while node is not x and node.op in ("reshape", "permute") and node.srcs:
        node = node.srcs[0]
    return node is x


# weights this large take dy @ columns^T on the cpu (see `_conv_vjp`): one thread, resnet18 b16's 512x4608 over
# K 784 56 vs 68 ms, 512x2304 28.6 vs 30.9; 256x2304 over 3136 and smaller weights over longer K stay swapped
WGRAD_PLAIN_MIN = 1 << 20


# ---------------------------------------------------------------- pooling


def max_pool2d(
    x: Tensor,
    kernel_size: IntPair,
    stride: IntPair | None = None,
    padding: IntPair = 0,
    dilation: IntPair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor:
    if return_indices:
        raise UnsupportedError("max_pool2d: return_indices=True is not supported")
    return _pool(x, "max", kernel_size, stride, padding, dilation, ceil_mode, True)


def avg_pool2d(
    x: Tensor,
    kernel_size: IntPair,
    stride: IntPair | None = None,
    padding: IntPair = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    if divisor_override is not None:
        return _pool(x, "sum", kernel_size, stride, padding, 1, ceil_mode, True) / float(divisor_override)
    return _pool(x, "avg", kernel_size, stride, padding, 1, ceil_mode, count_include_pad)


def _pool(
    x: Tensor,
    op: str,
    kernel_size: IntPair,
    stride: IntPair | None,
    padding: IntPair,
    dilation: IntPair,
    ceil_mode: bool,
    count_include_pad: bool,
) -> Tensor:
    _need_ndim(x, (3, 4), f"{op}_pool2d", "(N, C, H, W) or (C, H, W)")
    if x.ndim == 3:
        return _pool(x.unsqueeze(0), op, kernel_size, stride, padding, dilation, ceil_mode, count_include_pad).squeeze(
            0
        )
    kh, kw = _pair(kernel_size, "pool kernel_size")
    sh, sw = _pair(stride if stride is not None and stride != [] else (kh, kw), "pool stride")
    ph, pw = _pair(padding, "pool padding")
    dh, dw = _pair(dilation, "pool dilation")
    if ph > kh // 2 or pw > kw // 2:
        raise ShapeError(f"pool2d: padding {(ph, pw)} must be at most half the kernel size {(kh, kw)}")
    _n, _c, h, w = x.shape
    oh, ow = _out_size(h, kh, sh, ph, dh, ceil_mode), _out_size(w, kw, sw, pw, dw, ceil_mode)
    if oh < 1 or ow < 1:
        raise ShapeError(f"pool2d: input {x.shape} is too small for kernel {(kh, kw)}")
    if op == "max" and x.requires_grad and grad_enabled() and pool_grad.supports(x.node):
        return _max_pool_train(
            x, pool.PoolGeometry(x.shape[0], x.shape[1], h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
        )
    if x.requires_grad and grad_enabled() and (sh, sw) == (kh, kw) and (dh, dw) == (1, 1):
        if not (ph or pw) and (h, w) == (oh * kh, ow * kw):
            return _tiled_pool(x, op, kh, kw)
    if op == "max" and x.requires_grad and grad_enabled() and pool_cl.supports(x.node):
        return _max_pool_train_cl(
            x, pool.PoolGeometry(x.shape[0], x.shape[1], h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
        )
    if op == "max" and not (x.requires_grad and grad_enabled()) and pool.supports(x.node):
        geo = pool.PoolGeometry(x.shape[0], x.shape[1], h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow)
        return Tensor(pool.max_pool2d(x.node, geo))
    # pad enough on the far side for ceil_mode windows; those extra cells never count towards an average
    eh = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + 2 * ph))
    ew = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + 2 * pw))
    fill = -math.inf if op == "max" else 0.0
    xp = x.pad(((0, 0), (0, 0), (ph, ph + eh), (pw, pw + ew)), fill) if ph or pw or eh or ew else x
    if op == "max" and x.requires_grad and grad_enabled():
        return _max_pool_cols(xp, (kh, kw), (sh, sw), (dh, dw))
    views = _windows(xp, (kh, kw), (sh, sw), (dh, dw), (oh, ow))
    # an elementwise chain over the kh*kw strided views: one fused, branch-free kernel with no window tensor
    if op == "max":
        return functools.reduce(Tensor.maximum, views)
    total = functools.reduce(Tensor.__add__, views)
    if op == "sum":
        return total
    if count_include_pad and not (eh or ew):
        return total / float(kh * kw)
    return total / _pool_counts(h, w, (kh, kw), (sh, sw), (ph, pw), (oh, ow), count_include_pad, x)


def _max_pool_train(x: Tensor, geo: pool.PoolGeometry) -> Tensor:
    """Max pooling under autograd on the cpu: the pooling kernel's forward, and as its gradient one kernel that
    adds each output's gradient at its window's first maximum (plait/graph/ops/pool_grad.py; ties go to the first
    tap, as in PyTorch). The other forms write the windows out: as im2col columns whose maximum's gradient is a
    broadcast pass over the columns and a col2im (overlapping windows), or as a reduction over tiles whose gradient
    splits ties evenly (windows that tile the input)."""
    y = Tensor(pool.max_pool2d(x.node, geo))
    # the rule holds its own output weakly: a rule is kept in a table keyed weakly by that node
    x_node, y_ref = x.node, weakref.ref(y.node)

    def rule(grad: Node) -> list[tuple[Node, Node]]:
        y_node = y_ref()
        if y_node is None:
            raise PlaitError(f"max_pool2d {geo}: backward reached a pooled output that no longer exists")
        return [(x_node, pool_grad.max_pool2d_grad(x_node, y_node, grad, geo))]

    custom_vjp(y.node, rule)
    return y


def _max_pool_train_cl(x: Tensor, geo: pool.PoolGeometry) -> Tensor:
    """Max pooling of overlapping windows under autograd on OpenCL: each window's first maximum found once as an
    input offset, the output taken at it, and as the gradient one gather per input pixel over the windows that
    picked it (plait/graph/ops/pool_cl.py; ties go to the first tap, as in PyTorch). The im2col columns, their
    maximum, the broadcast pass over them and the col2im it replaces were four launches writing nine times the
    output (about 1.5 ms of resnet18's batch-64 step on an H100). Windows that tile the input keep their reduction
    form (`_tiled_pool`), whose gradient fuses with the elementwise backward around it.

    A pool over a ReLU sends its gradient straight to the ReLU's input, masked by `y > 0` at the pooled size
    (`_relu_pool_grad`)."""
    at = pool_cl.max_pool2d_argmax_cl(x.node, geo)
    y = Tensor(pool_cl.max_pool2d_take_cl(x.node, at, geo))
    # the rule keeps the offsets' node, not a Tensor (a live Tensor would pin its buffer in a plan), and y weakly:
    # a rule is kept in a table keyed weakly by that node
    x_node, y_ref = x.node, weakref.ref(y.node)

    def rule(grad: Node) -> list[tuple[Node, Node]]:
        if x_node.op == "relu":
            return [_relu_pool_grad(x_node, y_ref, at, grad, geo)]
        return [(x_node, pool_cl.max_pool2d_grad_cl(at, grad, geo))]

    custom_vjp(y.node, rule)
    return y


def _relu_pool_grad(
    r: Node, y_ref: weakref.ref[Node], at: Node, grad: Node, geo: pool.PoolGeometry
) -> tuple[Node, Node]:
    """The gradient of `max_pool2d(relu(z))` with respect to z, as (z, gradient). The pool's gradient lands only on
    each window's picked pixel, whose ReLU output is the window's output y; so ReLU's mask `z > 0` there is `y > 0`,
    and it is applied to the output gradient before the pool's gather (the two agree exactly, ties and NaN
    included: plait's ReLU maps NaN to 0). That mask is a quarter of the input's size or less and fuses into the
    kernel that makes the output gradient; ReLU's own backward, a pass over the whole input reading the
    pre-activation again, goes. alexnet b64 on an H100 ran three such passes, 0.12 ms of its step. Other readers of
    the ReLU's output still send theirs through the ReLU's gradient; the sum is the same."""
    y = y_ref()
    if y is None:
        raise PlaitError(f"max_pool2d {geo}: backward reached a pooled output that no longer exists")
    zero = ew.zeros_like(grad)
    return r.srcs[0], pool_cl.max_pool2d_grad_cl(at, ew.where(ew.binary("cmpgt", y, ew.zeros_like(y)), grad, zero), geo)


def _tiled_pool(x: Tensor, op: str, kh: int, kw: int) -> Tensor:
    """Pooling over non-overlapping windows that tile the input exactly, as a reduction over the window axes of an
    (N, C, OH, kh, OW, kw) view. Used when a gradient is recorded: the gradient of a reduction is one broadcast
    elementwise pass over the input, where the chain of strided views builds a padded view per window position and
    recomputes the running maxima in each of them (several times slower in a training step)."""
    n, c, h, w = x.shape
    tiles = x.reshape(n, c, h // kh, kh, w // kw, kw)
    if op == "max":
        return tiles.max(axis=(3, 5))
    total = tiles.sum(axis=(3, 5))
    return total if op == "sum" else total / float(kh * kw)


def _max_pool_cols(xp: Tensor, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]) -> Tensor:
    """Max pooling over overlapping windows of an already padded input when a gradient is recorded: the windows as
    im2col columns (N, C, kh*kw, OH, OW) and a max over the window axis. Its gradient is one broadcast pass over the
    columns and a col2im, where the chain of strided views builds a padded view per window position that recomputes
    the running maxima in each (resnet's 3x3/2 pool). The padding (ceil_mode's included) is already in `xp`, so
    the windows over it are exactly the pool's outputs."""
    n, c, h, w = xp.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    win = Window(n, c, h, w, kh, kw, sh, sw, 0, 0, dh, dw)
    return Tensor(im2col(xp.node, win)).reshape(n, c, kh * kw, win.oh, win.ow).max(axis=2)


def _pool_counts(
    h: int,
    w: int,
    k: tuple[int, int],
    s: tuple[int, int],
    p: tuple[int, int],
    o: tuple[int, int],
    incl: bool,
    like: Tensor,
) -> Tensor:
    """Per-output divisor of an average pool (torch: padding counts when count_include_pad, ceil overhang never)."""

    def axis(size: int, kk: int, ss: int, pp: int, oo: int) -> np.ndarray:
        start = np.arange(oo) * ss - pp
        end = np.minimum(start + kk, size + pp)
        if not incl:
            return np.minimum(end, size) - np.maximum(start, 0)
        return end - start

    counts: np.ndarray = np.outer(axis(h, k[0], s[0], p[0], o[0]), axis(w, k[1], s[1], p[1], o[1])).astype(
        like.dtype.np
    )
    return Tensor.from_numpy(counts, device=like.device)


def adaptive_avg_pool2d(x: Tensor, output_size: IntPair) -> Tensor:
    _need_ndim(x, (3, 4), "adaptive_avg_pool2d", "(N, C, H, W) or (C, H, W)")
    if x.ndim == 3:
        return adaptive_avg_pool2d(x.unsqueeze(0), output_size).squeeze(0)
    n, c, h, w = x.shape
    oh, ow = _pair(
        tuple(h if v is None else v for v in output_size) if not isinstance(output_size, int) else output_size,
        "adaptive_avg_pool2d output_size",
    )  # type: ignore[union-attr]
    if (oh, ow) == (1, 1):
        return x.mean(axis=(2, 3), keepdims=True)
    if h % oh == 0 and w % ow == 0:
        return x.reshape(n, c, oh, h // oh, ow, w // ow).mean(axis=(3, 5))
    # uneven windows: average with a (OH, H) and a (W, OW) matrix, which also gives the exact gradient
    return _separable(x, _adaptive_matrix(h, oh), _adaptive_matrix(w, ow))


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    m = np.zeros((out, size), dtype=np.float32)
    for i in range(out):
        a, b = (i * size) // out, -(-((i + 1) * size) // out)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _separable(x: Tensor, rows: np.ndarray, cols: np.ndarray) -> Tensor:
    """rows @ x @ cols.T over the last two axes of an (N, C, H, W) tensor (resampling by constant matrices)."""
    n, c, h, w = x.shape
    rt = Tensor.from_numpy(rows.astype(x.dtype.np), device=x.device)
    ct = Tensor.from_numpy(np.ascontiguousarray(cols.T).astype(x.dtype.np), device=x.device)
    y = x.reshape(n * c * h, w) @ ct  # (N*C*H, OW)
    y = y.reshape(n * c, h, cols.shape[0])
    return (rt.expand(n * c, rows.shape[0], h) @ y).reshape(n, c, rows.shape[0], cols.shape[0])


def _interp_matrix(size: int, out: int, mode: str, align_corners: bool | None, scale: float | None) -> np.ndarray:
    m = np.zeros((out, size), dtype=np.float32)
    dst = np.arange(out, dtype=np.float64)
    ratio = (1.0 / scale) if scale is not None else size / out
    if mode == "nearest":
        src = np.minimum(np.floor(dst * ratio).astype(np.int64), size - 1)
        m[np.arange(out), src] = 1.0
        return m
    if align_corners:
        pos = dst * ((size - 1) / (out - 1)) if out > 1 else np.zeros(out)
    else:
        pos = np.maximum((dst + 0.5) * ratio - 0.5, 0.0)
    i0 = np.minimum(np.floor(pos).astype(np.int64), size - 1)
    i1 = np.minimum(i0 + 1, size - 1)
    frac = (pos - i0).astype(np.float32)
    np.add.at(m, (np.arange(out), i0), 1.0 - frac)
    np.add.at(m, (np.arange(out), i1), frac)
    return m


def interpolate(
    x: Tensor,
    size: IntPair | None = None,
    scale_factor: float | Sequence[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
) -> Tensor:
    """Resize an (N, C, H, W) tensor with mode 'nearest' or 'bilinear' (torch's coordinate conventions)."""
    _need_ndim(x, (4,), "interpolate", "(N, C, H, W)")
    if mode not in ("nearest", "bilinear"):
        raise UnsupportedError(f"interpolate: mode {mode!r} is not supported (use 'nearest' or 'bilinear')")
    if (size is None) == (scale_factor is None):
        raise PlaitError("interpolate: give exactly one of size and scale_factor")
    h, w = x.shape[2:]
    if size is not None:
        oh, ow = _pair(size, "interpolate size")
        sc: tuple[float | None, float | None] = (None, None)
    else:
        assert scale_factor is not None
        fh, fw = (scale_factor, scale_factor) if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
        oh, ow = math.floor(h * fh), math.floor(w * fw)
        sc = (None, None) if recompute_scale_factor else (float(fh), float(fw))
    if mode == "nearest" and oh % h == 0 and ow % w == 0 and (size is not None or sc == (oh / h, ow / w)):
        n, c = x.shape[:2]
        return x.reshape(n, c, h, 1, w, 1).expand(n, c, h, oh // h, w, ow // w).reshape(n, c, oh, ow)
    rows = _interp_matrix(h, oh, mode, align_corners, sc[0])
    cols = _interp_matrix(w, ow, mode, align_corners, sc[1])
    return _separable(x, rows, cols)


upsample = interpolate


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return x.flatten(start_dim, end_dim)


# ---------------------------------------------------------------- normalisation


def batch_norm(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Batch norm over axis 1. In training, batch statistics are used; the running statistics are NOT updated
    here (torch updates them in place): nn.BatchNorm2d does that with `batch_norm_stats`."""
    out, _, _ = batch_norm_stats(x, running_mean, running_var, weight, bias, training, eps)
    return out


def batch_norm_stats(
    x: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    training: bool,
    eps: float,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """(output, batch mean, unbiased batch variance); the statistics are None in eval mode."""
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: expected an (N, C, ...) input, got shape {x.shape}")
    _need_float(x, "batch_norm")
    c = x.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var), ("weight", weight), ("bias", bias)):
        if t is not None and t.shape != (c,):
            raise ShapeError(f"batch_norm: {name} has shape {t.shape}, expected ({c},) for input {x.shape}")
    bshape = (1, c) + (1,) * (x.ndim - 2)
    axes = (0, *range(2, x.ndim))
    if training or running_mean is None or running_var is None:
        count = x.numel() // c
        if count <= 1:
            raise ShapeError(f"batch_norm: training needs more than one value per channel, got input shape {x.shape}")
        # the cpu: one kernel makes the statistics (plait/graph/ops/bnstat_c.py), whose output the backward reads too
        moments = bnstat_c.bn_moments_c(x.node, eps) if bnstat_c.supports(x.node) else None
        if moments is None:
            mean, var = _moments(x, axes)
            rs = (var + eps).sqrt().reciprocal()
        else:
            mean, var, rs = _rows(moments, bshape)
        d = x - mean
        xhat = d * rs
        # for the running averages: like torch's, they carry no gradient
        stats: tuple[Tensor | None, Tensor | None] = (
            _detached(lambda: mean.reshape(c)),
            _detached(lambda: var.reshape(c) * (count / (count - 1))),
        )
    else:
        # with running statistics the normalisation is one per-channel scale and shift, so the producer's epilogue
        # (a convolution's) does a multiply-add with two operands instead of four (as when an exported model has batch
        # norm folded into the convolution); scale and shift are computed from the parameters alone
        scale = (running_var + eps).sqrt().reciprocal() * (weight if weight is not None else 1.0)
        shift = (bias if bias is not None else 0.0) - running_mean * scale
        return x * scale.reshape(*bshape) + shift.reshape(*bshape), None, None
    if moments is not None:
        # (x - mean) * scale (+ bias) with scale = rs * weight per channel: three operations per value, so the
        # activation's readers (the forward's, the backward's mask) recompute it instead of one storing it (rs comes
        # stored from the kernel: computed from var here, its cost would make the scheduler store the sum); no
        # x * scale + shift, which cancels where |mean| >> std
        scale = rs if weight is None else rs * weight.reshape(*bshape)
        out = d * scale if bias is None else d * scale + bias.reshape(*bshape)
    else:
        out = xhat
        if weight is not None:
            out = out * weight.reshape(*bshape)
        if bias is not None:
            out = out + bias.reshape(*bshape)
    if stats[0] is not None and grad_enabled() and out.requires_grad:
        _batch_norm_vjp(out, x, xhat, rs, weight, bias, axes, moments)
    return out, stats[0], stats[1]


def _rows(node: Node, shape: tuple[int, ...]) -> tuple[Tensor, ...]:
    """The rows of a (k, C) node, each viewed in `shape` (1, C, 1, ...)."""
    rows = Tensor(node)
    return tuple(rows[i].reshape(*shape) for i in range(node.shape[0]))


def _moments(x: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Per-channel mean and biased variance over `axes`, kept as (1, C, 1, ...). Two passes (the mean, then the
    mean square deviation) where each is cheap; on OpenCL one reduction over [x - k, (x - k)^2] stacked, k each
    channel's first value: a shift close to the data keeps mean((x - k)^2) - mean(x - k)^2 from cancelling (the
    textbook one-pass formula with k = 0 loses the variance when |mean| >> std), and one read of x and one split
    reduction with its second stage replace two of each."""
    if not x.node.device.startswith("opencl"):
        count = x.numel() // x.shape[1]
        mean = _channel_sums(x, axes) * (1.0 / count)
        d = x - mean
        return mean, _channel_sums(d * d, axes) * (1.0 / count)
    k = x[(slice(0, 1), slice(None), *(slice(0, 1) for _ in axes[1:]))]
    xs = x - k
    m = stack([xs, xs * xs]).mean(axis=tuple(a + 1 for a in axes), keepdims=True)
    m1, m2 = m[0], m[1]
    return m1 + k, (m2 - m1 * m1).maximum(0.0)


def _channel_sums(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    """Per-channel sums of an (N, C, ...) tensor over `axes` (every axis but 1), kept as (1, C, 1, ...). On the cpu
    first over each image's plane, then over the images: every sum of the first stage runs along one contiguous
    plane, where one reduction over (N, H, W) split into image-sized parts recomputed its element's (n, y, x) with a
    division and two remainders per value (3-4x slower than reading the plane: resnet18's 64-channel batch norms)."""
    if not x.node.device.startswith("cpu") or x.ndim < 3:
        return x.sum(axis=axes, keepdims=True)
    n, c = x.shape[:2]
    keep = tuple(c if i == 1 else 1 for i in range(x.ndim))
    return x.reshape(n, c, -1).sum(axis=2).sum(axis=0).reshape(*keep)


def _batch_norm_vjp(
    out: Tensor,
    x: Tensor,
    xhat: Tensor,
    rs: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    axes: tuple[int, ...],
    moments: Node | None = None,
) -> None:
    """Training batch norm's gradient in closed form: with s = sum(g) and t = sum(g * xhat) per channel,
    dx = weight * rs * (g - s/count - xhat * t/count), dweight = t, dbias = s. Two channel sums and one elementwise
    pass; differentiated op by op through the mean, the variance and the normalisation it is four channel sums
    (each re-reading the upstream gradient and the input) and a longer elementwise chain. With `moments` (the cpu's
    statistics kernel) both sums come from one kernel reading g and x, t = rs * sum(g * (x - mean)), and xhat is
    recomputed from x where dx needs it: the forward then stores no xhat for the backward, only its output."""
    count = x.numel() // x.shape[1]
    bshape = tuple(x.shape[1] if i == 1 else 1 for i in range(x.ndim))
    # nodes, not Tensors, in the rule (see _conv_vjp)
    x_node, xhat_node, rs_node = x.node, xhat.node, rs.node
    w_node, b_node = (weight.node if weight is not None else None), (bias.node if bias is not None else None)

    # OpenCL: both sums from one reduction over [g, g * xhat] stacked (one split reduction and one second stage
    # instead of two of each, and the upstream gradient g is no longer stored for two readers but recomputed)
    paired = x.node.device.startswith("opencl")

    def rule(grad: Node) -> list[tuple[Node, Node]]:
        g, xh, r = Tensor(grad), Tensor(xhat_node), Tensor(rs_node)
        if moments is not None and bnstat_c.supports(grad):
            st = Tensor(bnstat_c.bn_grad_sums_c(grad, x_node, moments))
            s, t = st[0].reshape(*bshape), st[1].reshape(*bshape) * r
            xh = (Tensor(x_node) - _rows(moments, bshape)[0]) * r
        elif paired:
            st = stack([g, g * xh]).sum(axis=tuple(a + 1 for a in axes), keepdims=True)
            s, t = st[0], st[1]
        else:
            s = _channel_sums(g, axes)
            t = _channel_sums(g * xh, axes)
        scale = r if w_node is None else r * Tensor(w_node).reshape(*bshape)
        grads = [(x_node, (scale * (g - s * (1.0 / count) - xh * (t * (1.0 / count)))).node)]
        if w_node is not None:
            grads.append((w_node, t.reshape(-1).node))
        if b_node is not None:
            grads.append((b_node, s.reshape(-1).node))
        return grads

    custom_vjp(out.node, rule)


def layer_norm(
    x: Tensor,
    normalized_shape: Sequence[int] | int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    shp = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[x.ndim - len(shp) :]) != shp:
        raise ShapeError(f"layer_norm: input shape {x.shape} does not end with normalized_shape {shp}")
    _need_float(x, "layer_norm")
    axes = tuple(range(x.ndim - len(shp), x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    out = d * ((d * d).mean(axis=axes, keepdims=True) + eps).sqrt().reciprocal()
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def group_norm(
    x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    if x.ndim < 2 or x.shape[1] % num_groups:
        raise ShapeError(f"group_norm: {num_groups} groups do not divide the channels of input shape {x.shape}")
    n, c = x.shape[:2]
    g = x.reshape(n, num_groups, -1)
    mean = g.mean(axis=2, keepdims=True)
    d = g - mean
    out = (d * ((d * d).mean(axis=2, keepdims=True) + eps).sqrt().reciprocal()).reshape(*x.shape)
    bshape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(*bshape)
    if bias is not None:
        out = out + bias.reshape(*bshape)
    return out


# ---------------------------------------------------------------- dropout and lookups

_DROPOUT_RNG = [np.random.default_rng(0)]


def manual_seed(seed: int) -> None:
    """Seed dropout masks (and plait.nn's weight initialisation): the same seed gives the same masks."""
    _DROPOUT_RNG[0] = np.random.default_rng(seed)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, seed: int | None = None) -> Tensor:
    """Zero each element with probability p and scale the rest by 1/(1-p). The mask comes from a seeded NumPy
    generator (`manual_seed`, or `seed` for a one-off), so runs are reproducible."""
    if not 0.0 <= p <= 1.0:
        raise PlaitError(f"dropout: probability p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    shape, dt = x.shape, x.dtype.np

    def keep() -> np.ndarray:  # a replayed plait.compile_step draws a new mask per step, like an eager one
        rng = np.random.default_rng(seed) if seed is not None else _DROPOUT_RNG[0]
        return (rng.random(shape) >= p).astype(dt) * np.asarray(1.0 / (1.0 - p), dtype=dt)

    return x * Tensor.from_host(keep, device=x.device)


def embedding(
    input: Tensor, weight: Tensor, padding_idx: int | None = None, max_norm: float | None = None, **_: Any
) -> Tensor:
    """Rows of `weight` (num_embeddings, dim) picked by an integer tensor of any shape; out shape input.shape + (dim,).
    The gradient is a scatter-add into the table (rows at padding_idx get none)."""
    if max_norm is not None:
        raise UnsupportedError("embedding: max_norm is not supported")
    if input.dtype not in (dtypes.int32, dtypes.int64):
        raise DTypeError(f"embedding: indices must be int32 or int64, got {input.dtype.name} with shape {input.shape}")
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be (num_embeddings, embedding_dim), got {weight.shape}")
    v = weight.shape[0]
    # a plait.jit input placeholder has no values yet; a step traced by plait.compile_step must not read them back
    if input.node.buffer is not None and input.numel() and not capturing():
        idx = input.numpy()
        if idx.min() < 0 or idx.max() >= v:
            raise ShapeError(
                f"embedding: index {int(idx.min()) if idx.min() < 0 else int(idx.max())} is out of range for {v} embeddings"
            )
    flat = input.reshape(-1)
    rows = Tensor(indexing.gather_rows(weight.node, flat.node))
    if padding_idx is not None:
        pad_i = padding_idx % v
        keep = (flat != pad_i).unsqueeze(1).expand(*rows.shape)
        rows = where(keep, rows, stop_gradient(rows))
    return rows.reshape(*input.shape, weight.shape[1])


def one_hot(t: Tensor, num_classes: int) -> Tensor:
    """int64 one-hot encoding along a new last axis, as an elementwise compare (no gather needed)."""
    classes = Tensor.arange(num_classes, device=t.device)
    return (t.unsqueeze(-1).astype(dtypes.int64) == classes).astype(dtypes.int64)


# ---------------------------------------------------------------- attention


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over (..., L, E) / (..., S, E) / (..., S, Ev). A bool mask keeps True."""
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(f"scaled_dot_product_attention: q {query.shape}, k {key.shape}, v {value.shape} do not agree")
    ql, kl = query.shape[-2], key.shape[-2]
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = (query @ key.transpose(-2, -1)) * s
    if is_causal:
        causal = np.tril(np.ones((ql, kl), dtype=bool))
        scores = where(Tensor.from_numpy(causal, device=query.device), scores, -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == dtypes.bool_:
            scores = where(attn_mask, scores, -math.inf)
        else:
            scores = scores + attn_mask
    attn = softmax(scores, -1)
    if dropout_p > 0.0:
        attn = dropout(attn, dropout_p)
    return attn @ value


# ---------------------------------------------------------------- losses


def _reduce_loss(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise PlaitError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _class_last(x: Tensor) -> Tensor:
    """(N, C, d1, ...) -> (N, d1, ..., C): move the class axis last so targets line up with the leading axes."""
    return x if x.ndim <= 2 else x.permute(0, *range(2, x.ndim), 1)


def nll_loss(
    input: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int = -100, reduction: str = "mean"
) -> Tensor:
    """Negative log-likelihood of log-probabilities (N, C[, d...]) at integer targets (N[, d...])."""
    return _nll(input, target, weight, ignore_index, reduction, 0.0, "nll_loss")


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """log_softmax over axis 1 followed by the NLL of integer class targets (or of class probabilities)."""
    if input.ndim < 1:
        raise ShapeError("cross_entropy: input must have a class axis")
    if target.dtype.is_float:
        logp = log_softmax(input, 1 if input.ndim > 1 else 0)
        if target.shape != input.shape:
            raise ShapeError(f"cross_entropy: probability targets {target.shape} must match input {input.shape}")
        c = input.shape[1 if input.ndim > 1 else 0]
        t = target * (1.0 - label_smoothing) + label_smoothing / c if label_smoothing else target
        w = weight.reshape(c, *([1] * (input.ndim - 2))) if weight is not None and input.ndim > 1 else weight
        per = -((logp * w if w is not None else logp) * t).sum(axis=1 if input.ndim > 1 else 0)
        if reduction == "mean":
            return per.sum() / float(per.numel() if per.ndim else 1)
        return _reduce_loss(per, reduction, "cross_entropy")
    if (
        input.ndim == 2
        and input.node.device.startswith("opencl")
        and weight is None
        and not label_smoothing
        and reduction == "mean"
        and target.dtype in (dtypes.int32, dtypes.int64)
        and target.shape == input.shape[:1]
    ):
        return _class_cross_entropy(input, target, ignore_index)
    logp = log_softmax(input, 1 if input.ndim > 1 else 0)
    return _nll(logp, target, weight, ignore_index, reduction, label_smoothing, "cross_entropy")


def _class_cross_entropy(x: Tensor, target: Tensor, ignore_index: int) -> Tensor:
    """Mean cross-entropy of (N, C) logits at class targets in few kernels (OpenCL, where each launch costs ~5 us
    on a GPU): each row's sum of exponentials and its target's logit are one stacked row reduction, the loss and
    the count of counted targets one stacked sum, and the gradient softmax - one_hot, scaled, one elementwise
    kernel. Op by op (log_softmax, then NLL) alexnet b64's loss and gradient took 10 launches."""
    n, c = x.shape
    hot = one_hot(target, c).astype(x.dtype)  # ignored targets (e.g. -100) match no class: an all-zero row
    valid = (target.reshape(n, 1) != ignore_index).astype(x.dtype)
    z = x - _detached(lambda: x.max(axis=1, keepdims=True))
    sums = stack([z.exp(), z * hot]).sum(axis=2, keepdims=True)  # (2, N, 1): sum of exp(z), z at the target
    lse = sums[0].log()
    totals = stack([(lse - sums[1]) * valid, valid]).sum(axis=(1, 2))  # (2,): the summed loss, the counted rows
    loss = totals[0] / totals[1]
    x_node, z_node, sum_node, count_node = x.node, z.node, sums[0].node, totals[1].node

    def rule(grad: Node) -> list[tuple[Node, Node]]:
        # exp(z) / sum rather than exp(z - lse): lse then has one reader, the loss sum, which computes it inline
        soft = Tensor(z_node).exp() / Tensor(sum_node)
        return [(x_node, ((soft - hot) * valid * (Tensor(grad) / Tensor(count_node))).node)]

    custom_vjp(loss.node, rule)
    return loss


def _nll(
    logp: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, reduction: str, smoothing: float, op: str
) -> Tensor:
    if target.dtype not in (dtypes.int32, dtypes.int64):
        raise DTypeError(f"{op}: class targets must be int64, got {target.dtype.name}")
    squeeze = logp.ndim == 1
    if squeeze:
        logp, target = logp.unsqueeze(0), target.reshape(1)
    expect = (logp.shape[0], *logp.shape[2:])
    if tuple(target.shape) != expect:
        raise ShapeError(f"{op}: input {logp.shape} needs target shape {expect}, got {target.shape}")
    c = logp.shape[1]
    lp = _class_last(logp)  # (..., C)
    hot = one_hot(target, c).astype(lp.dtype)  # ignored targets (e.g. -100) match no class: an all-zero row
    valid = (target != ignore_index).astype(lp.dtype)
    w_hot = hot * weight if weight is not None else hot
    picked = -(lp * w_hot).sum(axis=-1)  # weight[t] * -logp[t]
    wt = (hot * weight).sum(axis=-1) * valid if weight is not None else valid
    loss = picked * valid
    if smoothing:
        w_all = lp * weight if weight is not None else lp
        smooth = -w_all.sum(axis=-1) * valid / float(c)
        loss = loss * (1.0 - smoothing) + smooth * smoothing
    if reduction == "mean":
        out = loss.sum() / wt.sum()
    else:
        out = _reduce_loss(loss, reduction, op)
    return out.reshape(()) if squeeze and reduction == "none" else out


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    if input.shape != target.shape:
        raise ShapeError(f"mse_loss: input shape {input.shape} differs from target shape {target.shape}")
    d = input - target
    return _reduce_loss(d * d, reduction, "mse_loss")


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    reduction: str = "mean",
    pos_weight: Tensor | None = None,
) -> Tensor:
    """Numerically stable BCE on logits: (1 - t) * x + (1 + (pw - 1) * t) * softplus(-x)."""
    if input.shape != target.shape:
        raise ShapeError(f"binary_cross_entropy_with_logits: input {input.shape} and target {target.shape} differ")
    # softplus(-x) = max(-x, 0) + log(1 + exp(-|x|))
    sp = (-input).maximum(0.0) + ((-input.abs()).exp() + 1.0).log()
    if pos_weight is not None:
        loss = (1.0 - target) * input + (1.0 + (pos_weight - 1.0) * target) * sp
    else:
        loss = (1.0 - target) * input + sp
    if weight is not None:
        loss = loss * weight
    return _reduce_loss(loss, reduction, "binary_cross_entropy_with_logits")


def concat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return cat(tensors, dim)
