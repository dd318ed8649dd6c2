"""Resize (opsets 10+) and Upsample (7-9): nearest, linear and cubic interpolation, antialiasing, every
coordinate_transformation_mode (tf_crop_and_resize with its roi and extrapolation_value), axes and
keep_aspect_ratio_policy.

Interpolation is separable: each resized axis is one product with a constant (n_out, n_in) matrix built on the host
from the attributes (which source pixels each output pixel reads, with which weights), so the device work is one
small matmul per axis whatever the mode.
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
from plait.onnx.ops.elementwise import _round

Coeffs = Callable[[float, float], np.ndarray]


def _resize(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    r = x.ndim
    mode = ctx.attr("mode", "nearest")
    ins = ins + [None] * (4 - len(ins))
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        roi, scales_in, sizes_in = None, ins[1], None
    else:
        roi, scales_in, sizes_in = ins[1], ins[2], ins[3]
    axes = [a % r for a in ctx.attr("axes", list(range(r)))]
    if sizes_in is not None and ctx.host(sizes_in, "sizes").size:
        wanted = ctx.ints(sizes_in, "sizes")
        scales = [1.0] * r
        sizes = list(x.shape)
        for a, n in zip(axes, wanted, strict=True):
            scales[a], sizes[a] = n / x.shape[a], n
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            raise ctx.error(f"Resize keep_aspect_ratio_policy {policy!r} (stretch, not_larger or not_smaller)")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(scales[a] for a in axes)
            for a in axes:
                scales[a], sizes[a] = s, int(s * x.shape[a] + 0.5)
    else:
        given = [float(v) for v in ctx.host(scales_in, "scales").astype(np.float64).reshape(-1)]
        scales = [1.0] * r
        for a, s in zip(axes, given, strict=True):
            scales[a] = s
        sizes = [int(s * n) for s, n in zip(scales, x.shape, strict=True)]
    box = _roi(ctx, roi, r, axes)
    coeffs = _coeff_fn(ctx, mode)
    y = x
    for a in axes:
        if sizes[a] == x.shape[a] and math.isclose(scales[a], 1.0) and box[a] == (0.0, 1.0):
            continue
        mat, outside = _axis_matrix(ctx, x.shape[a], sizes[a], scales[a], coeffs, box[a])
        y = _apply(ctx, y, a, mat, outside)
    return y


def _roi(ctx: Ctx, roi: Any, r: int, axes: list[int]) -> list[tuple[float, float]]:
    """(start, end) of the crop box per axis, as fractions of the input (tf_crop_and_resize only)."""
    box = [(0.0, 1.0)] * r
    if ctx.attr("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize" or roi is None:
        return box
    v = [float(t) for t in ctx.host(roi, "roi").reshape(-1)]
    if len(v) != 2 * len(axes):
        raise ctx.error(f"Resize roi has {len(v)} values; tf_crop_and_resize needs 2 per resized axis ({axes})")
    for i, a in enumerate(axes):
        box[a] = (v[i], v[len(axes) + i])
    return box


def _coeff_fn(ctx: Ctx, mode: str) -> Coeffs:
    """The weights of the source pixels around a sample at fraction `ratio` past a pixel, for scale `scale`."""
    if mode == "nearest":
        # Upsample (opsets 7-9) predates nearest_mode and always floors
        nm = "floor" if ctx.node.op_type == "Upsample" else ctx.attr("nearest_mode", "round_prefer_floor")
        return lambda ratio, scale: _nearest(ratio, nm)
    antialias = bool(ctx.attr("antialias", 0))
    if mode == "linear":
        return _linear_aa if antialias else lambda ratio, scale: np.array([1.0 - ratio, ratio])
    if mode == "cubic":
        a = float(ctx.attr("cubic_coeff_a", -0.75))
        return (lambda ratio, scale: _cubic_aa(ratio, scale, a)) if antialias else lambda ratio, _s: _cubic(ratio, a)
    raise ctx.unsupported(f"Resize mode {mode!r} (nearest, linear and cubic are defined)")


def _nearest(ratio: float, nm: str) -> np.ndarray:
    if float(ratio).is_integer():
        return np.array([0.0, 1.0])
    left = {
        "round_prefer_floor": ratio <= 0.5,
        "round_prefer_ceil": ratio < 0.5,
        "floor": True,
        "ceil": False,
    }[nm]
    return np.array([1.0, 0.0]) if left else np.array([0.0, 1.0])


def _cubic_kernel(d: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel with parameter `a`, at distances `d`."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


def _cubic(ratio: float, a: float) -> np.ndarray:
    return _cubic_kernel(np.array([1 + ratio, ratio, 1 - ratio, 2 - ratio]), a)


def _cubic_aa(ratio: float, scale: float, a: float) -> np.ndarray:
    """Cubic weights stretched by 1/scale when downsampling (antialias), normalised to sum 1."""
    s = min(scale, 1.0)
    start = math.floor(-2 / s) + 1
    w = _cubic_kernel(s * (np.arange(start, 2 - start) - ratio), a)
    return w / w.sum()


def _linear_aa(ratio: float, scale: float) -> np.ndarray:
    """Triangle weights stretched by 1/scale when downsampling (antialias), normalised to sum 1."""
    s = min(scale, 1.0)
    start = math.floor(-1 / s) + 1
    w = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
    return w / w.sum()


def _source(ctx: Ctx, n_in: int, n_out: int, scale: float, box: tuple[float, float]) -> np.ndarray:
    """The input coordinate that each output pixel samples."""
    ctm = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        ctm = "asymmetric"
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # the unrounded output length
    if ctm == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if ctm == "pytorch_half_pixel":
        return (y + 0.5) / scale - 0.5 if width != 1 else np.full(n_out, -0.5)
    if ctm == "align_corners":
        return y * (n_in - 1) / (width - 1) if width != 1 else np.zeros(n_out)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "half_pixel_symmetric":
        return n_in / 2 * (1 - n_out / width) + (y + 0.5) / scale - 0.5
    if ctm == "tf_crop_and_resize":
        lo, hi = box
        if width == 1:
            return np.full(n_out, (hi - lo) * (n_in - 1) / 2 + lo * (n_in - 1))
        return y * (hi - lo) * (n_in - 1) / (width - 1) + lo * (n_in - 1)
    raise ctx.unsupported(f"Resize coordinate_transformation_mode {ctm!r}")


def _axis_matrix(
    ctx: Ctx, n_in: int, n_out: int, scale: float, coeffs: Coeffs, box: tuple[float, float]
) -> tuple[np.ndarray, np.ndarray]:
    """(n_out, n_in) weights of one axis, and which outputs fall outside the input (tf_crop_and_resize: they take
    extrapolation_value). Each output reads the n source pixels nearest its coordinate (ties to the lower ones),
    clamped to the edge; exclude_outside drops the weights of pixels past the edge and renormalises."""
    src = _source(ctx, n_in, n_out, scale, box)
    mat = np.zeros((n_out, n_in), np.float64)
    exclude = bool(ctx.attr("exclude_outside", 0))
    for o, xo in enumerate(src):
        base = math.floor(xo)
        w = np.asarray(coeffs(1.0 if xo == base else xo - base, scale), np.float64)
        n = len(w)
        if n % 2 == 0:
            first = base - n // 2 + (0 if xo == base else 1)
        else:
            first = base - (n - 1) // 2 + (0 if xo - base <= 0.5 else 1)
        idx = np.arange(first, first + n)
        if exclude:
            w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
            w = w / (w.sum() or 1.0)
        np.add.at(mat[o], np.clip(idx, 0, n_in - 1), w)
    outside = (src < 0) | (src > n_in - 1)
    if ctx.attr("coordinate_transformation_mode", "half_pixel") != "tf_crop_and_resize":
        outside[:] = False
    return mat, outside


def _apply(ctx: Ctx, x: Tensor, a: int, mat: np.ndarray, outside: np.ndarray) -> Tensor:
    """x resampled along axis `a` by `mat`; outputs flagged `outside` take extrapolation_value."""
    moved = x.transpose(a, -1) if a != x.ndim - 1 else x
    if outside.any():
        mat = np.where(outside[:, None], 0.0, mat)
    y = moved.astype(dtypes.float32) @ ctx.t(mat.T.astype(np.float32))
    if outside.any():
        fill = float(ctx.attr("extrapolation_value", 0.0))
        y = y + ctx.t(np.where(outside, fill, 0.0).astype(np.float32))
    if not x.dtype.is_float:  # integer images: round to the nearest value, as the reference's cast does
        y = _round(y)
    y = y.astype(x.dtype)
    return y.transpose(a, -1) if a != x.ndim - 1 else y


register("Resize", _resize)
register("Upsample", _resize)
