"""Quantization ONNX ops: QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked), DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

Quantized values live in plait dtypes (int32 for the integer types, float32 for float8/float4, see
plait/onnx/formats.py) and everything is computed on the device: quantizing rounds half to even and saturates to
the type's range (float8/float4 through the formats' rounding), and integer products accumulate in int32 as ONNX
Runtime does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto as TP

from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.onnx import formats
from plait.onnx.importer import Ctx, compute_dtype
from plait.onnx.loader import elem_name, elem_np
from plait.onnx.ops import TABLE, register

# the integer types a quantizer saturates to: element type -> (lowest, highest)
_RANGES: dict[int, tuple[int, int]] = {
    TP.UINT8: (0, 255),
    TP.INT8: (-128, 127),
    TP.UINT16: (0, 65535),
    TP.INT16: (-32768, 32767),
    TP.UINT4: (0, 15),
    TP.INT4: (-8, 7),
    TP.UINT2: (0, 3),
    TP.INT2: (-2, 1),
}
_FLOAT8 = (TP.FLOAT8E4M3FN, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2, TP.FLOAT8E5M2FNUZ)


def _along(ctx: Ctx, v: Any, shape: tuple[int, ...], axis: int, block: int, what: str) -> Tensor:
    """Scale or zero point `v` as a float32 tensor that broadcasts against an input of `shape`: a scalar (or one
    value), a 1-D tensor along `axis`, or with `block` > 0 one value per block of `block` elements along `axis`."""
    t = ctx.t(v).astype(dtypes.float32)
    if t.ndim == 0 or (t.ndim == 1 and t.shape[0] == 1 and not block):
        return t.reshape(())
    a = axis + len(shape) if axis < 0 else axis
    if not 0 <= a < len(shape):
        raise ctx.error(f"axis {axis} is out of range for an input of shape {shape}")
    if not block:
        if t.ndim != 1 or t.shape[0] != shape[a]:
            raise ctx.error(
                f"{what} has shape {t.shape}; per-axis quantization along axis {a} of {shape} needs ({shape[a]},)"
            )
        return t.reshape(*[shape[a] if i == a else 1 for i in range(len(shape))])
    nb = -(-shape[a] // block)
    want = tuple(nb if i == a else d for i, d in enumerate(shape))
    if block < 0 or t.shape != want:
        raise ctx.error(
            f"{what} has shape {t.shape}; blocked quantization of {shape} along axis {a} with block_size {block}"
            f" needs {want}"
        )
    wide = t.unsqueeze(a + 1).expand(*t.shape[: a + 1], block, *t.shape[a + 1 :])
    wide = wide.reshape(*t.shape[:a], nb * block, *t.shape[a + 1 :])
    return wide[tuple(slice(0, shape[a]) if i == a else slice(None) for i in range(len(shape)))]


def _quantize(ctx: Ctx, x: Tensor, to: int, zp: Tensor | None, saturate: bool) -> Tensor:
    """`x` (already divided by the scale) rounded and saturated into element type `to`, plus zero point `zp`."""
    if to in _RANGES:
        lo, hi = _RANGES[to]
        q = formats.rne(x)
        if zp is not None:
            q = q + zp
        return q.clip(float(lo), float(hi)).astype(dtypes.int32)
    if to in _FLOAT8:
        return formats.round_float(x, formats.FLOATS[to], saturate)
    if to == TP.FLOAT4E2M1:
        return formats.round_float(x if zp is None else x + zp, formats.FLOATS[to], True)
    raise ctx.unsupported(f"quantizing to element type {elem_name(to)} is not supported")


def _quantize_linear(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    zp_in = ins[2] if len(ins) > 2 else None
    to = int(ctx.attr("output_dtype", 0))
    if zp_in is not None:
        zt = ctx.elem_type(2, zp_in)
        if to and to != zt:
            raise ctx.error(f"output_dtype {elem_name(to)} differs from the zero point's type {elem_name(zt)}")
        to = zt
    to = to or TP.UINT8
    axis, block = int(ctx.attr("axis", 1)), int(ctx.attr("block_size", 0))
    scale = _along(ctx, ins[1], x.shape, axis, block, "y_scale")
    precision = int(ctx.attr("precision", 0))
    xf = x.astype(dtypes.float32)
    if precision:  # divide in the named float type (float16: rounded there, as ONNX Runtime does)
        dt = compute_dtype(elem_np(precision), ctx.label)
        xf = formats.cast(xf, precision, dt).astype(dtypes.float32)
        scale = formats.cast(scale, precision, dt).astype(dtypes.float32)
    zp = None if zp_in is None or to in _FLOAT8 else _along(ctx, zp_in, x.shape, axis, block, "y_zero_point")
    return _quantize(ctx, formats.div_rn(xf, scale), to, zp, bool(ctx.attr("saturate", 1)))


def _dequantize_linear(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    xt = ctx.elem_type(0, ins[0])
    axis, block = int(ctx.attr("axis", 1)), int(ctx.attr("block_size", 0))
    scale = _along(ctx, ins[1], x.shape, axis, block, "x_scale")
    zp_in = ins[2] if len(ins) > 2 else None
    y = x.astype(dtypes.float32)
    if zp_in is not None and xt not in _FLOAT8 and xt != TP.FLOAT4E2M1:
        y = y - _along(ctx, zp_in, x.shape, axis, block, "x_zero_point")
    elif zp_in is not None and isinstance(zp_in, np.ndarray) and np.any(zp_in.astype(np.float32) != 0):
        raise ctx.error(f"a float8 input's zero point must be 0, got {zp_in.tolist()}")
    to = int(ctx.attr("output_dtype", 0)) or ctx.elem_type(1, ins[1])
    return formats.cast(y * scale, to, compute_dtype(elem_np(to), ctx.label))


def _dynamic_quantize_linear(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    """uint8 quantization with a scale and zero point from x's range (widened to include 0)."""
    x = ctx.t(ins[0]).astype(dtypes.float32)
    hi = x.max().maximum(0.0)
    lo = x.min().minimum(0.0)
    scale = formats.div_rn(where(hi == lo, 1.0, hi - lo), Tensor.full((), 255.0, dtypes.float32, x.device))
    zp = formats.rne((0.0 - formats.div_rn(lo, scale)).clip(0.0, 255.0))
    y = (formats.rne(formats.div_rn(x, scale)) + zp).clip(0.0, 255.0).astype(dtypes.int32)
    return [y, scale.astype(ctx.t(ins[0]).dtype), zp.astype(dtypes.int32)]


def _centered(ctx: Ctx, v: Any, zp: Any, axis_len: int | None = None) -> Tensor:
    """Integer input `v` minus its zero point, in int32. `axis_len`: a 1-D zero point of that length is per row
    (it applies along the second-to-last axis, as MatMulInteger's a_zero_point)."""
    t = ctx.t(v).astype(dtypes.int32)
    if zp is None:
        return t
    z = ctx.t(zp).astype(dtypes.int32)
    if z.ndim == 1 and z.shape[0] == 1:
        z = z.reshape(())
    elif z.ndim == 1 and axis_len is not None and z.shape[0] == axis_len:
        z = z.reshape(axis_len, 1)
    return t - z


def _matmul_integer(ctx: Ctx, ins: list[Any]) -> Tensor:
    a, b = ctx.t(ins[0]), ins[1]
    rows = a.shape[-2] if a.ndim >= 2 else None
    return _centered(ctx, a, ins[2] if len(ins) > 2 else None, rows) @ _centered(
        ctx, b, ins[3] if len(ins) > 3 else None
    )


def _per_channel(ctx: Ctx, v: Any, zp: Any, nd: int) -> Tensor:
    """Convolution weights minus a scalar or per-output-channel zero point, in int32."""
    w = ctx.t(v).astype(dtypes.int32)
    if zp is None:
        return w
    z = ctx.t(zp).astype(dtypes.int32)
    if z.ndim == 1 and z.shape[0] == 1:
        z = z.reshape(())
    elif z.ndim == 1:
        z = z.reshape(z.shape[0], *([1] * (nd - 1)))
    return w - z


def _conv_integer(ctx: Ctx, ins: list[Any]) -> Tensor:
    w = ctx.t(ins[1])
    x = _centered(ctx, ins[0], ins[2] if len(ins) > 2 else None)
    wz = _per_channel(ctx, w, ins[3] if len(ins) > 3 else None, w.ndim)
    return TABLE["Conv"].fn(ctx, [x, wz])


def _requantize(ctx: Ctx, acc: Tensor, mult: Tensor, zp: Any, to: int) -> Tensor:
    """int32 accumulator `acc` times `mult`, rounded, plus zero point `zp`, saturated into type `to`."""
    z = None if zp is None else ctx.t(zp).astype(dtypes.float32)
    if z is not None and z.ndim == 1 and z.shape[0] == 1:
        z = z.reshape(())
    return _quantize(ctx, acc.astype(dtypes.float32) * mult, to, z, True)


def _qlinear_matmul(ctx: Ctx, ins: list[Any]) -> Tensor:
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (list(ins) + [None] * 8)[:8]
    at = ctx.t(a)
    rows = at.shape[-2] if at.ndim >= 2 else None
    acc = _centered(ctx, at, a_zp, rows) @ _centered(ctx, b, b_zp)
    mult = formats.div_rn(_scale(ctx, a_s, rows) * _scale(ctx, b_s), _scale(ctx, y_s))
    to = ctx.elem_type(7, y_zp) if y_zp is not None else ctx.elem_type(0, a)
    return _requantize(ctx, acc, mult, y_zp, to)


def _scale(ctx: Ctx, v: Any, rows: int | None = None) -> Tensor:
    t = ctx.t(v).astype(dtypes.float32)
    if t.ndim == 1 and t.shape[0] == 1:
        return t.reshape(())
    if t.ndim == 1 and rows is not None and t.shape[0] == rows:
        return t.reshape(rows, 1)
    return t


def _qlinear_conv(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = (list(ins) + [None] * 9)[:9]
    wt = ctx.t(w)
    acc = TABLE["Conv"].fn(ctx, [_centered(ctx, x, x_zp), _per_channel(ctx, wt, w_zp, wt.ndim)])
    if bias is not None:
        acc = acc + ctx.t(bias).astype(dtypes.int32).reshape(-1, *([1] * (acc.ndim - 2)))
    ws = _scale(ctx, w_s)
    if ws.ndim == 1:
        ws = ws.reshape(-1, *([1] * (acc.ndim - 2)))
    to = ctx.elem_type(7, y_zp) if y_zp is not None else ctx.elem_type(0, x)
    return _requantize(ctx, acc, formats.div_rn(_scale(ctx, x_s) * ws, _scale(ctx, y_s)), y_zp, to)


register("QuantizeLinear", _quantize_linear)
register("DequantizeLinear", _dequantize_linear)
register("DynamicQuantizeLinear", _dynamic_quantize_linear)
register("MatMulInteger", _matmul_integer)
register("ConvInteger", _conv_integer)
register("QLinearMatMul", _qlinear_matmul)
register("QLinearConv", _qlinear_conv)
