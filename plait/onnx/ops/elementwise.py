"""Elementwise ONNX ops: arithmetic, comparisons, logic, activations, unary math, Cast, Where, Clip.

Each op has a device implementation on plait Tensors and, where shape subgraphs use it, a NumPy fold.
Inverse trigonometric functions that plait has no primitive for are composed from exp/log/sqrt (the hyperbolic
ones) or a range-reduced series (atan, and asin/acos through it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx

import plait.nn.functional as F
from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.onnx import formats
from plait.onnx.importer import Ctx, compute_dtype
from plait.onnx.loader import elem_name, elem_np
from plait.onnx.ops import register

T = Tensor


def _pair(ctx: Ctx, ins: list[Any]) -> tuple[Tensor, Tensor]:
    a, b = ins[0], ins[1]
    ta = ctx.t(a) if isinstance(a, Tensor) or not isinstance(b, Tensor) else _like(ctx, a, b)
    tb = ctx.t(b) if isinstance(b, Tensor) or not isinstance(a, Tensor) else _like(ctx, b, a)
    return ta, tb


def _like(ctx: Ctx, host: np.ndarray, dev: Tensor) -> Tensor:
    """Upload a host operand in the dtype of its device partner (ONNX binary ops take equal types)."""
    if host.ndim == 0 or host.size == 1:
        return Tensor.full(host.shape, host.reshape(-1)[0].item(), dev.dtype, dev.device)
    return ctx.t(host).astype(dev.dtype)


def _int_div(a: Tensor, b: Tensor) -> Tensor:
    """C-style (truncating) integer division, exact while quotients stay below 2**24."""
    safe_b = where(b == 0, 1, b)
    m = a % safe_b  # Python-style: the sign of the divisor
    floor_q = ((a - m).float() / safe_b.float()).floor()
    fix = ((m != 0) & ((a < 0) != (safe_b < 0))).astype(dtypes.float32)
    return (floor_q + fix).astype(a.dtype)


def _div(a: Tensor, b: Tensor) -> Tensor:
    return a / b if a.dtype.is_float else _int_div(a, b)


def _mod(ctx: Ctx, a: Tensor, b: Tensor) -> Tensor:
    if not ctx.attr("fmod", 0):  # the remainder takes the divisor's sign (NumPy's mod), floats included
        return a % b
    m = a % b  # fmod takes the dividend's sign: fix Python-style results whose sign differs
    return where((m != 0) & ((m < 0) != (a < 0)), m - b, m)


def _np_int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
        return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)
    return (a / b).astype(a.dtype)


def _binary(name: str, dev: Callable[[Tensor, Tensor], Tensor], fold: Callable[[np.ndarray, np.ndarray], Any]) -> None:
    register(
        name,
        lambda ctx, ins: dev(*_pair(ctx, ins)),
        lambda ctx, ins: np.asarray(fold(ins[0], ins[1])),
    )


_binary("Add", lambda a, b: a + b, lambda a, b: (a + b).astype(np.result_type(a, b)))
_binary("Sub", lambda a, b: a - b, lambda a, b: (a - b).astype(np.result_type(a, b)))
_binary("Mul", lambda a, b: a * b, lambda a, b: (a * b).astype(np.result_type(a, b)))
_binary("Div", _div, _np_int_div)
_binary("Equal", lambda a, b: a == b, np.equal)
_binary("Less", lambda a, b: a < b, np.less)
_binary("LessOrEqual", lambda a, b: a <= b, np.less_equal)
_binary("Greater", lambda a, b: a > b, np.greater)
_binary("GreaterOrEqual", lambda a, b: a >= b, np.greater_equal)
_binary("And", lambda a, b: a & b, np.logical_and)
_binary("Or", lambda a, b: a | b, np.logical_or)
_binary("Xor", lambda a, b: a ^ b, np.logical_xor)
_binary("BitwiseAnd", lambda a, b: a & b, np.bitwise_and)
_binary("BitwiseOr", lambda a, b: a | b, np.bitwise_or)
_binary("BitwiseXor", lambda a, b: a ^ b, np.bitwise_xor)


def _pow(ctx: Ctx, ins: list[Any]) -> Tensor:
    base = ctx.t(ins[0])
    ex = ins[1]
    if isinstance(ex, np.ndarray) and ex.size == 1 and base.dtype.is_float:
        e = float(ex.reshape(-1)[0])
        if e == 2.0:
            return base * base
        if e == 0.5:
            return base.sqrt()
        if e == 1.0:
            return base
    et = ctx.t(ex)
    return base ** et.astype(base.dtype)


register("Pow", _pow)
register("Mod", lambda ctx, ins: _mod(ctx, *_pair(ctx, ins)))


def _variadic(name: str, dev: Callable[[Tensor, Tensor], Tensor], fold: Callable[..., Any], mean: bool = False) -> None:
    def fn(ctx: Ctx, ins: list[Any]) -> Tensor:
        ts = [ctx.t(x) for x in ins if x is not None]
        out = ts[0]
        for t in ts[1:]:
            out = dev(out, t)
        return out / float(len(ts)) if mean else out

    def fold_fn(ctx: Ctx, ins: list[Any]) -> np.ndarray:
        arrs = [x for x in ins if x is not None]
        out = arrs[0]
        for a in arrs[1:]:
            out = fold(out, a).astype(out.dtype)
        return np.asarray(out / len(arrs) if mean else out).astype(arrs[0].dtype)

    register(name, fn, fold_fn)


_variadic("Sum", lambda a, b: a + b, np.add)
_variadic("Mean", lambda a, b: a + b, np.add, mean=True)
_variadic("Max", lambda a, b: a.maximum(b), np.maximum)
_variadic("Min", lambda a, b: a.minimum(b), np.minimum)


def _unary(name: str, dev: Callable[[Tensor], Tensor], fold: Callable[[np.ndarray], Any] | None = None) -> None:
    def fold_fn(ctx: Ctx, ins: list[Any]) -> np.ndarray:
        assert fold is not None
        return np.asarray(fold(ins[0])).astype(ins[0].dtype)

    register(name, lambda ctx, ins: dev(ctx.t(ins[0])), fold_fn if fold else None)


def _atan(x: Tensor) -> Tensor:
    """atan by range reduction: |x| > 1 via pi/2 - atan(1/|x|), then two half-angle steps
    (atan z = 2 atan(z / (1 + sqrt(1 + z^2)))) to |z| <= tan(pi/16), then an odd series to z^15."""
    ax = x.abs()
    big = ax > 1.0
    z = where(big, 1.0 / where(big, ax, 1.0), ax)
    for _ in range(2):
        z = z / (1.0 + (1.0 + z * z).sqrt())
    z2 = z * z
    series = z * 0.0
    for k in range(15, 0, -2):
        series = series * z2 + (1.0 if (k // 2) % 2 == 0 else -1.0) / k
    r = 4.0 * z * series
    r = where(big, math.pi / 2 - r, r)
    return where(x < 0, -r, r)


def _asin(x: Tensor) -> Tensor:
    return _atan(x / (1.0 - x * x).maximum(0.0).sqrt())


_unary("Abs", lambda x: x.abs(), np.abs)
_unary("Neg", lambda x: -x, np.negative)
_unary("Exp", lambda x: x.exp())
_unary("Log", lambda x: x.log())
_unary("Sqrt", lambda x: x.sqrt(), np.sqrt)
_unary("Reciprocal", lambda x: x.reciprocal(), np.reciprocal)
_unary("Floor", lambda x: x.floor(), np.floor)
_unary("Ceil", lambda x: x.ceil(), np.ceil)
_unary("Sign", lambda x: x.sign(), np.sign)
_unary("Sin", lambda x: x.sin())
_unary("Cos", lambda x: x.cos())
_unary("Tan", lambda x: x.sin() / x.cos())
_unary("Sinh", lambda x: (x.exp() - (-x).exp()) * 0.5)
_unary("Cosh", lambda x: (x.exp() + (-x).exp()) * 0.5)
_unary("Asinh", lambda x: where(x < 0, -((-x) + (x * x + 1.0).sqrt()).log(), (x + (x * x + 1.0).sqrt()).log()))
_unary("Acosh", lambda x: (x + (x * x - 1.0).sqrt()).log())
_unary("Atanh", lambda x: ((1.0 + x) / (1.0 - x)).log() * 0.5)
_unary("Atan", _atan)
_unary("Asin", _asin)
_unary("Acos", lambda x: math.pi / 2 - _asin(x))
_unary("Erf", lambda x: x.erf())
_unary("Sigmoid", lambda x: x.sigmoid())
_unary("Tanh", lambda x: x.tanh())
_unary("Relu", lambda x: x.relu() if x.dtype.is_float else x.maximum(0))
_unary("Not", lambda x: x.logical_not(), np.logical_not)
_unary("BitwiseNot", lambda x: ~x, np.invert)
_unary("Softsign", lambda x: x / (1.0 + x.abs()))
_unary("Softplus", lambda x: where(x > 20.0, x, (x.minimum(20.0).exp() + 1.0).log()))
_unary("Mish", lambda x: x * where(x > 20.0, x, (x.minimum(20.0).exp() + 1.0).log()).tanh())
_unary("IsNaN", lambda x: x != x, np.isnan)
_unary("HardSwish", lambda x: x * (x / 6.0 + 0.5).clip(0.0, 1.0))


def _round(x: Tensor) -> Tensor:
    """Round half to even (ONNX and NumPy), from floor: ties go to the even neighbour."""
    f = (x + 0.5).floor()
    tie = (f - x) == 0.5
    odd = (f * 0.5).floor() * 2.0 != f
    return where(tie & odd, f - 1.0, f)


_unary("Round", _round, np.round)


def _act(name: str, fn: Callable[[Ctx, Tensor], Tensor]) -> None:
    register(name, lambda ctx, ins: fn(ctx, ctx.t(ins[0])))


_act("LeakyRelu", lambda c, x: where(x >= 0, x, x * float(c.attr("alpha", 0.01))))
_act("Elu", lambda c, x: where(x > 0, x, (x.exp() - 1.0) * float(c.attr("alpha", 1.0))))
_act(
    "Selu",
    lambda c, x: (
        where(x > 0, x, (x.exp() - 1.0) * float(c.attr("alpha", 1.67326319217681884765625)))
        * float(c.attr("gamma", 1.05070102214813232421875))
    ),
)
_act(
    "Celu",
    lambda c, x: (
        x.maximum(0.0) + ((x / float(c.attr("alpha", 1.0))).exp() - 1.0).minimum(0.0) * float(c.attr("alpha", 1.0))
    ),
)
_act("HardSigmoid", lambda c, x: (x * float(c.attr("alpha", 0.2)) + float(c.attr("beta", 0.5))).clip(0.0, 1.0))
_act("ThresholdedRelu", lambda c, x: where(x > float(c.attr("alpha", 1.0)), x, 0.0))
_act("Swish", lambda c, x: x * (x * float(c.attr("alpha", 1.0))).sigmoid())
_act("Gelu", lambda c, x: F.gelu(x, approximate=str(c.attr("approximate", "none"))))
_act(
    "Shrink",
    lambda c, x: where(
        x < -float(c.attr("lambd", 0.5)),
        x + float(c.attr("bias", 0.0)),
        where(x > float(c.attr("lambd", 0.5)), x - float(c.attr("bias", 0.0)), 0.0),
    ),
)


def _isinf(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    hit = (x == math.inf) & bool(pos)
    return hit | ((x == -math.inf) & bool(neg))


register("IsInf", _isinf)


def _prelu(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, slope = _pair(ctx, ins)
    return where(x < 0, x * slope, x)


register("PRelu", _prelu)


def _clip(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
    else:
        lo = ins[1] if len(ins) > 1 else None
        hi = ins[2] if len(ins) > 2 else None
    # a select reads x twice, and the scheduler fuses an epilogue only where a reshaped product (a convolution
    # without bias) is read once: there maximum/minimum keep the clip in the product's kernel
    select = x.node.op != "reshape"
    out = x
    if lo is not None:
        b = _scalar_or_tensor(ctx, lo, x)
        out = where(out < b, b, out) if select and _plain_bound(lo) else out.maximum(b)
    if hi is not None:
        b = _scalar_or_tensor(ctx, hi, x)
        out = where(out > b, b, out) if select and _plain_bound(hi) else out.minimum(b)
    return out


def _plain_bound(v: Any) -> bool:
    """True for a bound known on the host that is not NaN. Such a bound clips with a select, which keeps a NaN input
    NaN as maximum/minimum do and vectorises in a fused epilogue (mobilenet_v2's ReLU6 GEMMs: 1.25 instead of 1.61 ms
    with maximum/minimum, whose NaN test does not)."""
    return isinstance(v, (np.ndarray, float, int)) and not np.isnan(np.asarray(v, np.float64)).any()


def _scalar_or_tensor(ctx: Ctx, v: Any, like: Tensor) -> Any:
    if isinstance(v, (np.ndarray, float, int)):  # an input known on the host, or an attribute of opsets < 11
        return Tensor.full((), np.asarray(v).reshape(-1)[0].item(), like.dtype, like.device)
    return ctx.t(v).astype(like.dtype)


register("Clip", _clip)


def _cast_to(ctx: Ctx, x: Any, to: int) -> Any:
    """Cast `x` to ONNX element type `to`. Narrow types (bfloat16, float8, float4, int4...) are rounded on the device
    by plait/onnx/formats.py, even for host inputs, so the fold and the device give the same values."""
    npd = elem_np(to)
    if npd is None or to == onnx.TensorProto.STRING:
        raise ctx.unsupported(f"cast to element type {elem_name(to)} is not supported (plait has no string tensors)")
    mode = str(ctx.attr("round_mode", "up"))
    if mode not in formats.ROUND_MODES:
        raise ctx.error(f"round_mode {mode!r} is not one of {formats.ROUND_MODES}")
    if isinstance(x, np.ndarray) and not formats.is_storage(to):
        return x.astype(npd)
    return formats.cast(ctx.t(x), to, compute_dtype(npd, ctx.label), bool(ctx.attr("saturate", 1)), mode)


def _cast(ctx: Ctx, ins: list[Any]) -> Any:
    return _cast_to(ctx, ins[0], int(ctx.attr("to")))


register("Cast", _cast, _cast)


def _castlike(ctx: Ctx, ins: list[Any]) -> Any:
    return _cast_to(ctx, ins[0], ctx.elem_type(1, ins[1]))


register("CastLike", _castlike, _castlike)


def _bit_width(ctx: Ctx, t: int) -> int:
    npd = elem_np(t)
    if npd is None or npd.kind not in "biuf" or (npd.kind == "f" and t not in formats.IEEE) or npd.itemsize > 4:
        raise ctx.unsupported(
            f"BitCast of {elem_name(t)} is not supported (plait reinterprets bool, 8- to 32-bit integers, float32,"
            " float16 and bfloat16; double and 64-bit integers are not computed in 64 bits)"
        )
    return 8 * npd.itemsize


def _bitcast(ctx: Ctx, ins: list[Any]) -> Tensor:
    """Reinterpret the bits of x as element type `to`, with exact integer and float arithmetic on the device (plait
    has no bit-level view of its buffers): the bit pattern is assembled as an int64, then read back."""
    src, to = ctx.elem_type(0, ins[0]), int(ctx.attr("to"))
    width = _bit_width(ctx, src)
    if _bit_width(ctx, to) != width:
        raise ctx.error(f"BitCast from {elem_name(src)} to {elem_name(to)} changes the bit width")
    x = ctx.t(ins[0])
    if src in formats.IEEE:
        bits = formats.float_bits(x, *formats.IEEE[src])
    else:
        bits = x.astype(dtypes.int64) & ((1 << width) - 1)
    dt = compute_dtype(elem_np(to), ctx.label)
    if to in formats.IEEE:
        return formats.bits_float(bits, *formats.IEEE[to]).astype(dt)
    if to == onnx.TensorProto.BOOL:
        return bits != 0
    if elem_np(to).kind == "i":
        bits = where(bits >= 1 << (width - 1), bits - (1 << width), bits)
    return bits.astype(dt)


register("BitCast", _bitcast)


def _where(ctx: Ctx, ins: list[Any]) -> Tensor:
    c = ctx.t(ins[0])
    a, b = ins[1], ins[2]
    if isinstance(a, np.ndarray) and isinstance(b, Tensor):
        a = _like(ctx, a, b)
    if isinstance(b, np.ndarray) and isinstance(a, Tensor):
        b = _like(ctx, b, a)
    return where(c, ctx.t(a), ctx.t(b))


register("Where", _where, lambda ctx, ins: np.where(ins[0], ins[1], ins[2]).astype(np.result_type(ins[1], ins[2])))


def _identity(ctx: Ctx, ins: list[Any]) -> Any:
    return ins[0]


register("Identity", _identity, _identity, sequences=True)
