# ruff: noqa: E741  (Tile notation names tensors I, O, K as in the contraction formulas)
"""Standard contractions written in Tile, plus two that no standard library has.

Every op here is a few lines of index arithmetic; forward kernels, gradients and their kernels all come from
the compiler. Layouts follow PyTorch (NCHW activations, (CO, CI/groups, KH, KW) weights).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from plait.errors import TileError
from plait.tile import lang as tile
from plait.tile.spec import Aff


def _tup(v: int | Sequence[int], nd: int, what: str) -> tuple[int, ...]:
    t = (v,) * nd if isinstance(v, int) else tuple(v)
    if len(t) != nd or any(not isinstance(x, int) for x in t):
        raise TileError(f"{what} must be an int or {nd} ints, got {v!r}")
    return t


@tile.op
def matmul(A: Any, B: Any) -> Any:
    """C[i, j] += A[i, k] * B[k, j] (lowered to the tuned GEMM template)."""
    i, j, k = tile.indices("i j k")
    C = tile.output((A.shape[0], B.shape[1]), name="C")
    C[i, j] += A[i, k] * B[k, j]
    return C


@tile.op
def batch_matmul(A: Any, B: Any) -> Any:
    """C[b, i, j] += A[b, i, k] * B[b, k, j]."""
    b, i, j, k = tile.indices("b i j k")
    C = tile.output((A.shape[0], A.shape[1], B.shape[2]), name="C")
    C[b, i, j] += A[b, i, k] * B[b, k, j]
    return C


@tile.op
def maxplus_matmul(A: Any, B: Any) -> Any:
    """The tropical (max-plus) matrix product C[i, j] = max_k A[i, k] + B[k, j] (shortest/longest paths,
    Viterbi). The gradient flows to the (A, B) pair that attains the maximum."""
    i, j, k = tile.indices("i j k")
    C = tile.output((A.shape[0], B.shape[1]), name="C")
    C[i, j] = tile.max(A[i, k] + B[k, j])
    return C


@tile.op
def morph_dilate2d(I: Any, K: Any, padding: int = 0) -> Any:
    """Grayscale morphological dilation: O[n, c, y, x] = max over (ky, kx) of I[n, c, y+ky-p, x+kx-p] + K[c, ky, kx],
    with reads outside the image excluded (a max-plus convolution)."""
    n, c, y, x, ky, kx = tile.indices("n c y x ky kx")
    N, C, H, W = I.shape
    _, KH, KW = K.shape
    O = tile.output((N, C, H + 2 * padding - KH + 1, W + 2 * padding - KW + 1))
    O[n, c, y, x] = tile.max(I[n, c, y + ky - padding, x + kx - padding] + K[c, ky, kx])
    return O


def _out_size(size: int, k: int, s: int, p: int, d: int, what: str) -> int:
    o = (size + 2 * p - d * (k - 1) - 1) // s + 1
    if o < 1:
        raise TileError(
            f"{what}: input size {size} is too small for kernel {k} (dilation {d}, padding {p}, stride {s})"
        )
    return o


def _conv(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: int, nd: int, what: str) -> Any:
    s, p, d = _tup(stride, nd, "stride"), _tup(padding, nd, "padding"), _tup(dilation, nd, "dilation")
    N, CI = x.shape[:2]
    CO, CIg = w.shape[:2]
    if CI != CIg * groups or CO % groups:
        raise TileError(f"{what}: {CI} input channels, weight {w.shape} and groups={groups} do not agree")
    COg = CO // groups
    sp = [_out_size(x.shape[2 + a], w.shape[2 + a], s[a], p[a], d[a], what) for a in range(nd)]
    n, co, ci = tile.indices("n co ci")
    ys = tile.indices(" ".join(f"y{a}" for a in range(nd)))
    ks = tile.indices(" ".join(f"k{a}" for a in range(nd)))
    src = x.padded() if any(p) else x
    pos = [y * s[a] + k * d[a] - p[a] for a, (y, k) in enumerate(zip(ys, ks, strict=True))]
    if groups == 1:
        O = tile.output((N, CO, *sp))
        O[(n, co, *ys)] += src[(n, ci, *pos)] * w[(co, ci, *ks)]
        return O
    g = tile.index("g")
    O = tile.output((N, groups, COg, *sp))
    O[(n, g, co, *ys)] += src[(n, g * CIg + ci, *pos)] * w[(g * COg + co, ci, *ks)]
    return O.reshape(N, CO, *sp)


@tile.op
def conv1d(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
    """1-d convolution (cross-correlation, like torch.nn.functional.conv1d)."""
    return _conv(x, w, stride, padding, dilation, groups, 1, "conv1d")


@tile.op
def conv2d(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
    """2-d convolution: O[n, co, y, x] += I[n, ci, y*s + ky*d - p, x*s + kx*d - p] * K[co, ci, ky, kx]."""
    return _conv(x, w, stride, padding, dilation, groups, 2, "conv2d")


@tile.op
def conv3d(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Any:
    """3-d convolution (like torch.nn.functional.conv3d)."""
    return _conv(x, w, stride, padding, dilation, groups, 3, "conv3d")


@tile.op
def dilated_conv2d(x: Any, w: Any, steps: tuple[int, int] = (1, 2), stride: Any = 1) -> Any:
    """A convolution whose kernel taps are `steps[0]` rows and `steps[1]` columns apart (a different dilation
    per axis), written directly: O[n, co, y, x] += I[n, ci, y*s + ky*dy, x*s + kx*dx] * K[co, ci, ky, kx]."""
    dy, dx = steps
    sy, sx = _tup(stride, 2, "stride")
    n, co, ci, y, x_, ky, kx = tile.indices("n co ci y x ky kx")
    N, _, H, W = x.shape
    CO, _, KH, KW = w.shape
    O = tile.output(
        (N, CO, _out_size(H, KH, sy, 0, dy, "dilated_conv2d"), _out_size(W, KW, sx, 0, dx, "dilated_conv2d"))
    )
    O[n, co, y, x_] += x[n, ci, y * sy + ky * dy, x_ * sx + kx * dx] * w[co, ci, ky, kx]
    return O


@tile.op
def conv_transpose2d(
    x: Any, w: Any, stride: Any = 1, padding: Any = 0, output_padding: Any = 0, groups: int = 1, dilation: Any = 1
) -> Any:
    """Transposed 2-d convolution (weight (CI, CO/groups, KH, KW), like torch's conv_transpose2d), written as the
    scatter it is: O[n, co, y*s + ky*d - p, ...] += I[n, ci, y, ...] * K[ci, co, ky, ...]. The compiler turns
    the affine output index back into a gather loop."""
    s, p, d = _tup(stride, 2, "stride"), _tup(padding, 2, "padding"), _tup(dilation, 2, "dilation")
    op_ = _tup(output_padding, 2, "output_padding")
    N, CI = x.shape[:2]
    _, COg, KH, KW = w.shape
    if CI % groups:
        raise TileError(f"conv_transpose2d: {CI} input channels do not split into {groups} groups")
    CIg = CI // groups
    sizes = [(x.shape[2 + a] - 1) * s[a] - 2 * p[a] + d[a] * ((KH, KW)[a] - 1) + op_[a] + 1 for a in range(2)]
    n, g, co, y, x_, ky, kx = tile.indices("n g co y x ky kx")
    ci = tile.index("ci", CIg)
    O = tile.output((N, groups, COg, *sizes))
    oy = y * s[0] + ky * d[0] - p[0]
    ox = x_ * s[1] + kx * d[1] - p[1]
    O[n, g, co, oy, ox] += x[n, g * CIg + ci, y, x_] * w[g * CIg + ci, co, ky, kx]
    return O.reshape(N, groups * COg, *sizes)


def _pool(
    x: Any, kernel: Any, stride: Any, padding: Any, nd: int, what: str
) -> tuple[Any, list[Aff], tuple[Aff, ...], tuple[int, ...]]:
    """Output shape, input positions, output spatial indices and window of an N-d pooling."""
    k = _tup(kernel, nd, "kernel_size")
    s = _tup(stride if stride is not None else kernel, nd, "stride")
    p = _tup(padding, nd, "padding")
    sp = [_out_size(x.shape[2 + a], k[a], s[a], p[a], 1, what) for a in range(nd)]
    ys = tile.indices(" ".join(f"y{a}" for a in range(nd)))
    ks = tile.indices(" ".join(f"k{a}" for a in range(nd)), {f"k{a}": k[a] for a in range(nd)})
    pos = [y * s[a] + kk - p[a] for a, (y, kk) in enumerate(zip(ys, ks, strict=True))]
    return (*x.shape[:2], *sp), pos, ys, k


@tile.op
def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Any:
    """Max pooling; padded positions are excluded (as in PyTorch). Gradient goes to the selected element."""
    shape, pos, ys, _ = _pool(x, kernel_size, stride, padding, 2, "max_pool2d")
    n, c = tile.indices("n c")
    O = tile.output(shape)
    O[(n, c, *ys)] = tile.max(x[(n, c, *pos)])
    return O


@tile.op
def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Any:
    """Average pooling; padding counts as zeros (PyTorch's count_include_pad=True)."""
    shape, pos, ys, k = _pool(x, kernel_size, stride, padding, 2, "avg_pool2d")
    n, c = tile.indices("n c")
    O = tile.output(shape)
    O[(n, c, *ys)] += x.padded()[(n, c, *pos)]
    return O * (1.0 / math.prod(k))


__all__ = [
    "avg_pool2d",
    "batch_matmul",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose2d",
    "dilated_conv2d",
    "matmul",
    "max_pool2d",
    "maxplus_matmul",
    "morph_dilate2d",
]
