"""ONNX element types that plait stores in a wider dtype, and the conversions between element types (Cast).

plait computes in float32, float16, int32, int64 and bool. bfloat16, the float8 family (e4m3fn, e4m3fnuz, e5m2,
e5m2fnuz, e8m0), float4e2m1 and int4/uint4/int2/uint2 are storage formats: their values live in float32 or int32
on the device. Where an op produces one of them (Cast, CastLike, QuantizeLinear), `cast` rounds on the device with
plait elementwise ops to exactly the values the format holds (round to nearest even on the format's grid, subnormals
included; saturation and NaN/inf rules per format; integers wrap as two's complement), so the host conversion at the
model boundary (onnx's ml_dtypes arrays, which numpy_helper packs and unpacks) is exact.

>>> import numpy as np, plait
>>> x = plait.tensor(np.array([0.47892547, 1000.0, -1e-7], np.float32))
>>> cast(x, onnx.TensorProto.FLOAT8E4M3FN, plait.float32).numpy().tolist()
[0.46875, 448.0, -0.0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto as TP

from plait import dtypes
from plait.dtypes import DType
from plait.frontends.native.tensor import Tensor, where


@dataclass(frozen=True)
class FloatFormat:
    """A narrow float: `mbits` stored mantissa bits, normal exponents `emin`..`emax`, largest finite `max`.
    `overflow` is what a value beyond `max` becomes without saturation: 'inf', 'nan', or 'max' (float4 has neither,
    so it always clamps); `saturates`: the `saturate` attribute applies (float8 only); `neg_zero`: the format has a
    negative zero (the 'fnuz' variants do not); `has_nan`: NaN stays NaN (float4 makes it 0)."""

    mbits: int
    emin: int
    emax: int
    max: float
    overflow: str
    saturates: bool = True
    neg_zero: bool = True
    has_nan: bool = True


FLOATS: dict[int, FloatFormat] = {
    TP.BFLOAT16: FloatFormat(7, -126, 127, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), "inf", saturates=False),
    TP.FLOAT8E4M3FN: FloatFormat(3, -6, 8, 448.0, "nan"),
    TP.FLOAT8E4M3FNUZ: FloatFormat(3, -7, 7, 240.0, "nan", neg_zero=False),
    TP.FLOAT8E5M2: FloatFormat(2, -14, 15, 57344.0, "inf"),
    TP.FLOAT8E5M2FNUZ: FloatFormat(2, -15, 15, 57344.0, "nan", neg_zero=False),
    TP.FLOAT4E2M1: FloatFormat(1, 0, 2, 6.0, "max", saturates=False, has_nan=False),
}

# integer storage formats: (bits, signed). int8/16 and uint8/16 wrap the same way inside a graph.
INTS: dict[int, tuple[int, bool]] = {
    TP.INT2: (2, True),
    TP.UINT2: (2, False),
    TP.INT4: (4, True),
    TP.UINT4: (4, False),
    TP.INT8: (8, True),
    TP.UINT8: (8, False),
    TP.INT16: (16, True),
    TP.UINT16: (16, False),
}

# the ml_dtypes arrays onnx uses for these types -> the plait dtype that holds their values
STORAGE: dict[np.dtype, DType] = {
    np.dtype(t): dtypes.float32
    for t in (
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
        ml_dtypes.float8_e8m0fnu,
        ml_dtypes.float4_e2m1fn,
    )
} | {np.dtype(t): dtypes.int32 for t in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2)}

ROUND_MODES = ("up", "down", "nearest")


def elem_of(npd: Any) -> int:
    """The ONNX element type of NumPy (or ml_dtypes) dtype `npd`."""
    return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(npd)))


def is_storage(elem_type: int) -> bool:
    """True for the element types that `cast` must round or wrap (they have no plait dtype of their own)."""
    return elem_type in FLOATS or elem_type in INTS or elem_type == TP.FLOAT8E8M0


def _binade(a: Tensor, lo: int, hi: int) -> tuple[Tensor, Tensor, Tensor]:
    """(2**e, 2**-e, e) for e = floor(log2(a)) clamped to [lo, hi], for a >= 0. A binary search of selects: each
    step multiplies by a power of two, which is exact, so no log/pow rounding can put a value in the wrong binade,
    and the reciprocal lets callers scale by multiplying (a device's division may be approximate)."""
    full = Tensor.full
    p, inv = full(a.shape, 2.0**lo, dtypes.float32, a.device), full(a.shape, 2.0**-lo, dtypes.float32, a.device)
    e = full(a.shape, float(lo), dtypes.float32, a.device)
    k = 1 << (hi - lo).bit_length()
    while k > 1:
        k //= 2
        cand, cinv = p, inv
        for _ in range(max(1, k // 64)):  # 2**128 is not a float32: take big steps 2**64 at a time
            cand, cinv = cand * 2.0 ** min(k, 64), cinv * 2.0 ** -min(k, 64)
        up = a >= cand
        p, inv, e = where(up, cand, p), where(up, cinv, inv), where(up, e + float(k), e)
    return p.minimum(2.0**hi), inv.maximum(2.0**-hi), e.minimum(float(hi))


def rne(y: Tensor) -> Tensor:
    """Round half to even (exact for |y| < 2**23, which covers every grid position below a format's overflow)."""
    f = (y + 0.5).floor()
    odd_tie = ((f - y) == 0.5) & ((f * 0.5).floor() * 2.0 != f)
    return where(odd_tie, f - 1.0, f)


def _split(v: Tensor) -> tuple[Tensor, Tensor]:
    """v = hi + lo exactly, hi with 12 significant bits (v rounded on its binade's 2**-11 grid), lo the rest: the
    halves multiply exactly in float32 (Dekker)."""
    p, inv, _ = _binade(v.abs(), -126, 127)
    hi = rne(v * inv * 2048.0) * (p * 2.0**-11)
    return hi, v - hi


def div_rn(a: Tensor, b: Tensor) -> Tensor:
    """a / b rounded to the nearest float32 even where the device's division is not (OpenCL allows 2.5 ulp, and
    NVIDIA's default build uses that): the residual a - q b of the device quotient q comes from exact half-width
    products (Dekker), and one correction step moves q to the nearest float32 (a quotient is never a tie)."""
    q = a / b
    qh, ql = _split(q)
    bh, bl = _split(b)
    r = (((a - qh * bh) - qh * bl) - ql * bh) - ql * bl
    fixed = q + r / b
    return where((fixed == fixed) & (fixed.abs() < math.inf), fixed, q)


def round_float(x: Tensor, fmt: FloatFormat, saturate: bool) -> Tensor:
    """float32 `x` rounded to the nearest value of `fmt` (ties to even), as float32."""
    a = x.abs()
    p, inv, _ = _binade(a, fmt.emin, fmt.emax)  # the grid step at a's binade is p * 2**-mbits (fixed in subnormals)
    r = rne(a * inv * 2.0**fmt.mbits) * (p * 2.0**-fmt.mbits)
    over = r > fmt.max
    if fmt.overflow == "max" or (saturate and fmt.saturates):
        r = where(over, fmt.max, r)
    else:
        r = where(over, math.inf if fmt.overflow == "inf" else math.nan, r)
    if fmt.neg_zero:
        neg = (x < 0) | (x.reciprocal() < 0)  # 1/-0 is -inf: keeps the sign of a negative zero
    else:
        neg = (x < 0) & (r != 0)
    r = where(neg, -r, r)
    return where(x != x, math.nan if fmt.has_nan else 0.0, r)


def round_e8m0(x: Tensor, saturate: bool, mode: str) -> Tensor:
    """float32 `x` as float8e8m0 (a power of two 2**-127..2**127, or NaN): the exponent of |x|, rounded per `mode`
    as onnx does it on the bit pattern ('up': any fraction bumps it; 'nearest': from half-way; 'down': never)."""
    a = x.abs()
    p = _binade(a, -126, 127)[0]
    tiny = 2.0**-127  # float32 subnormals and zero have a zero exponent field: 2**-127, or 2**-126 when rounded up
    if mode == "down":
        r, sub = p, Tensor.full(a.shape, tiny, dtypes.float32, a.device)
    else:
        bump = a > p if mode == "up" else a >= p * 1.5
        top = 2.0**127
        r = where(bump, where(p == top, top if saturate else math.nan, p * 2.0), p)
        sub = where(a > (0.0 if mode == "up" else tiny), 2.0**-126, tiny)
    r = where(a < 2.0**-126, sub, r)
    return where((a != a) | (a == math.inf), math.nan, r)


def wrap_int(x: Tensor, bits: int, signed: bool) -> Tensor:
    """Integer `x` reduced to `bits` bits as two's complement (what a C cast to the narrow type does)."""
    m = x & ((1 << bits) - 1)
    if not signed:
        return m
    half = 1 << (bits - 1)
    return where(m >= half, m - (1 << bits), m)


def cast(x: Tensor, to: int, dt: DType, saturate: bool = True, round_mode: str = "up") -> Tensor:
    """ONNX Cast of device tensor `x` to element type `to`, stored in plait dtype `dt`, computed on x's device: the
    result holds exactly the values of `to`."""
    if to in FLOATS:
        return round_float(x.astype(dtypes.float32), FLOATS[to], saturate)
    if to == TP.FLOAT8E8M0:
        return round_e8m0(x.astype(dtypes.float32), saturate, round_mode)
    if dt.is_float or dt == dtypes.bool_:
        return x.astype(dt)
    if x.dtype.is_float:
        x = where(x != x, 0.0, x)  # NaN has no integer value; pick 0 rather than undefined behaviour
    y = x.astype(dt)
    return wrap_int(y, *INTS[to]) if to in INTS else y


def float_bits(x: Tensor, ebits: int, mbits: int) -> Tensor:
    """The bit pattern (as a non-negative int64) of float `x` in the IEEE-style format with `ebits` exponent and
    `mbits` mantissa bits, assembled from exact float arithmetic (x must hold values of that format). NaN becomes
    the quiet NaN with a clear sign: payloads are not kept."""
    bias = (1 << (ebits - 1)) - 1
    xf = x.astype(dtypes.float32)
    a = xf.abs()
    _, inv, e = _binade(a, 1 - bias, bias)
    normal = a >= 2.0 ** (1 - bias)
    finite = a < math.inf
    sub = a * 2.0**mbits * 2.0 ** (bias - 1)  # subnormal: a / 2**(1 - bias - mbits), in two exact steps
    mant = where(normal, (where(finite, a, 1.0) * inv - 1.0) * 2.0**mbits, sub)
    special = (a == math.inf) | (a != a)
    mant = where(special, where(a != a, 2.0 ** (mbits - 1), 0.0), mant)
    expo = where(special, float((1 << ebits) - 1), where(normal, e + float(bias), 0.0))
    sign = (xf < 0) | (xf.reciprocal() < 0)
    bits = expo.astype(dtypes.int64) * (1 << mbits) + mant.astype(dtypes.int64)
    return where(sign, bits + (1 << (ebits + mbits)), bits)


def bits_float(b: Tensor, ebits: int, mbits: int) -> Tensor:
    """The float32 value of bit patterns `b` (non-negative int64) of the IEEE-style format with `ebits` exponent
    and `mbits` mantissa bits; the power of two is built bit by bit from the exponent field, so it is exact."""
    bias = (1 << (ebits - 1)) - 1
    top = 1 << (ebits + mbits)
    mag = b % top
    mant = mag % (1 << mbits)
    expo = (mag - mant).astype(dtypes.float32) * 2.0**-mbits
    m = mant.astype(dtypes.float32)
    scale = Tensor.full(b.shape, 2.0**-bias, dtypes.float32, b.device)
    for i in range(ebits):
        bit = (expo * 2.0**-i).floor() - (expo * 2.0 ** -(i + 1)).floor() * 2.0
        for _ in range(max(1, (1 << i) // 64)):  # 2**128 in two steps of 2**64
            scale = where(bit == 1.0, scale * 2.0 ** min(1 << i, 64), scale)
    v = where(expo == 0.0, m * 2.0 ** (1 - bias - mbits), (m * 2.0**-mbits + 1.0) * scale)
    v = where(expo == float((1 << ebits) - 1), where(m == 0.0, math.inf, math.nan), v)
    return where(b >= top, -v, v)


# the formats BitCast reinterprets: IEEE-style floats (exponent bits, mantissa bits)
IEEE: dict[int, tuple[int, int]] = {TP.FLOAT: (8, 23), TP.FLOAT16: (5, 10), TP.BFLOAT16: (8, 7)}


class ValueTypes:
    """The ONNX element type of each named value of a model's main graph, so that an op can ask for the type of an
    input that plait holds in a wider dtype (CastLike's target, QuantizeLinear's zero point). Declared types come
    first; shape inference runs once, on the first name they miss (it copies the model, so only models that ask pay)."""

    def __init__(self, model: onnx.ModelProto):
        self._model = model
        self._types = _types_of(model.graph)
        self._inferred = False

    def get(self, name: str) -> int | None:
        if name not in self._types and not self._inferred:
            self._inferred = True
            try:
                self._types = _types_of(onnx.shape_inference.infer_shapes(self._model).graph) | self._types
            except Exception:  # inference is advisory: keep what the model declares
                pass
        return self._types.get(name)


def _types_of(graph: onnx.GraphProto) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in [*graph.input, *graph.value_info, *graph.output]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            out[v.name] = int(v.type.tensor_type.elem_type)
    for t in graph.initializer:
        out[t.name] = int(t.data_type)
    return out
