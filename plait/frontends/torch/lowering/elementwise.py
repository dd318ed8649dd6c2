"""Elementwise ATen ops: arithmetic, comparisons, activations and their backward helpers, casts and fills."""

from __future__ import annotations

import math
from typing import Any

import torch

from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.frontends.torch.lowering import DTYPES, aten, plait_dtype, register
from plait.nn import functional as F


def _t(x: Any, like: Tensor) -> Tensor:
    """A Python number as a 0-d plait tensor next to `like` (for ops whose first operand is the scalar)."""
    return x if isinstance(x, Tensor) else like._other(x)


def _alpha(b: Any, alpha: Any) -> Any:
    return b if alpha is None or alpha == 1 else b * alpha


@register(aten.add.Tensor, aten.add.Scalar)
def add(a: Any, b: Any, alpha: Any = None) -> Tensor:
    return a + _alpha(b, alpha) if isinstance(a, Tensor) else _alpha(b, alpha) + a


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(a: Any, b: Any, alpha: Any = None) -> Tensor:
    return a - _alpha(b, alpha) if isinstance(a, Tensor) else (-_alpha(b, alpha)) + a


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a: Any, b: Any, alpha: Any = None) -> Tensor:
    return sub(b, a, alpha) if isinstance(b, Tensor) else _t(b, a) - _alpha(a, alpha)


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(a: Any, b: Any) -> Tensor:
    return a * b if isinstance(a, Tensor) else b * a


def _plain_div(node: torch.fx.Node) -> bool:
    return node.kwargs.get("rounding_mode") in (None, "floor") and len(node.args) <= 2


@register(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode, supports=_plain_div)
def div(a: Any, b: Any, rounding_mode: str | None = None) -> Tensor:
    q = a / b if isinstance(a, Tensor) else _t(a, b) / b
    if rounding_mode == "floor":
        q = q.floor()
        ref = a if isinstance(a, Tensor) else b
        if not ref.dtype.is_float and not (isinstance(b, Tensor) and b.dtype.is_float):
            q = q.astype(ref.dtype)
    return q


@register(aten.neg.default)
def neg(x: Tensor) -> Tensor:
    return -x


def _unary(name: str) -> Any:
    return lambda x: getattr(x, name)()


for _op, _name in (
    (aten.exp.default, "exp"),
    (aten.log.default, "log"),
    (aten.sqrt.default, "sqrt"),
    (aten.reciprocal.default, "reciprocal"),
    (aten.abs.default, "abs"),
    (aten.sigmoid.default, "sigmoid"),
    (aten.tanh.default, "tanh"),
    (aten.relu.default, "relu"),
    (aten.sin.default, "sin"),
    (aten.cos.default, "cos"),
    (aten.erf.default, "erf"),
    (aten.floor.default, "floor"),
    (aten.ceil.default, "ceil"),
    (aten.sign.default, "sign"),
    (aten.logical_not.default, "logical_not"),
):
    register(_op)(_unary(_name))


@register(aten.rsqrt.default)
def rsqrt(x: Tensor) -> Tensor:
    return x.sqrt().reciprocal()


@register(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def pow_(a: Any, b: Any) -> Tensor:
    if isinstance(a, Tensor) and not isinstance(b, Tensor):
        if b == 2:
            return a * a
        if b == 1:
            return a
        if b == 0.5:
            return a.sqrt()
    return a**b if isinstance(a, Tensor) else _t(a, b) ** b


@register(aten.maximum.default)
def maximum(a: Tensor, b: Tensor) -> Tensor:
    return a.maximum(b)


@register(aten.minimum.default)
def minimum(a: Tensor, b: Tensor) -> Tensor:
    return a.minimum(b)


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return x.clip(min, max)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x: Tensor, v: Any) -> Tensor:
    return x.maximum(v)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x: Tensor, v: Any) -> Tensor:
    return x.minimum(v)


@register(aten.hardtanh.default)
def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    return F.hardtanh(x, min_val, max_val)


@register(aten.hardtanh_backward.default)
def hardtanh_backward(g: Tensor, x: Tensor, min_val: float, max_val: float) -> Tensor:
    return where((x > min_val) & (x < max_val), g, 0.0)


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where_(c: Tensor, a: Any, b: Any) -> Tensor:
    return where(c, a, b)


def _cmp(method: str) -> Any:
    def f(a: Any, b: Any) -> Tensor:
        return getattr(a, method)(b)

    return f


for _ops, _m in (
    ((aten.eq.Tensor, aten.eq.Scalar), "__eq__"),
    ((aten.ne.Tensor, aten.ne.Scalar), "__ne__"),
    ((aten.lt.Tensor, aten.lt.Scalar), "__lt__"),
    ((aten.le.Tensor, aten.le.Scalar), "__le__"),
    ((aten.gt.Tensor, aten.gt.Scalar), "__gt__"),
    ((aten.ge.Tensor, aten.ge.Scalar), "__ge__"),
    ((aten.logical_and.default,), "__and__"),
    ((aten.logical_or.default,), "__or__"),
):
    register(*_ops)(_cmp(_m))


@register(aten.bitwise_not.default)
def bitwise_not(x: Tensor) -> Tensor:
    return ~x


def _cast_ok(node: torch.fx.Node) -> bool:
    dt = node.kwargs.get("dtype")
    return dt is None or dt in DTYPES


@register(aten._to_copy.default, supports=_cast_ok)
def to_copy(x: Tensor, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    return x.astype(plait_dtype(dtype)) if dtype is not None else x * 1 if x.dtype != dtypes.bool_ else x


@register(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default)
def identity(x: Tensor, **_: Any) -> Tensor:
    return x


@register(aten.copy.default)
def copy(dst: Tensor, src: Tensor, non_blocking: bool = False) -> Tensor:
    return src.astype(dst.dtype).expand(*dst.shape)


@register(aten.gelu.default)
def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    return F.gelu(x, approximate)


@register(aten.gelu_backward.default)
def gelu_backward(g: Tensor, x: Tensor, approximate: str = "none") -> Tensor:
    if approximate == "tanh":
        k = math.sqrt(2.0 / math.pi)
        inner = (x + x * x * x * 0.044715) * k
        t = inner.tanh()
        d_inner = (x * x * (3 * 0.044715) + 1.0) * k
        return g * (0.5 * (t + 1.0) + 0.5 * x * (1.0 - t * t) * d_inner)
    cdf = ((x * (1.0 / math.sqrt(2.0))).erf() + 1.0) * 0.5
    pdf = (x * x * -0.5).exp() * (1.0 / math.sqrt(2.0 * math.pi))
    return g * (cdf + x * pdf)


@register(aten.silu.default)
def silu(x: Tensor) -> Tensor:
    return x * x.sigmoid()


@register(aten.silu_backward.default)
def silu_backward(g: Tensor, x: Tensor) -> Tensor:
    s = x.sigmoid()
    return g * s * (x * (1.0 - s) + 1.0)


@register(aten.sigmoid_backward.default)
def sigmoid_backward(g: Tensor, y: Tensor) -> Tensor:
    return g * y * (1.0 - y)


@register(aten.tanh_backward.default)
def tanh_backward(g: Tensor, y: Tensor) -> Tensor:
    return g * (1.0 - y * y)


@register(aten.threshold_backward.default)
def threshold_backward(g: Tensor, x: Tensor, threshold: float) -> Tensor:
    return where(x <= threshold, 0.0, g)


@register(aten.leaky_relu.default)
def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    return F.leaky_relu(x, negative_slope)


@register(aten.hardswish.default)
def hardswish(x: Tensor) -> Tensor:
    return F.hardswish(x)


@register(aten.hardsigmoid.default)
def hardsigmoid(x: Tensor) -> Tensor:
    return F.hardsigmoid(x)


def _dtype_of(node: torch.fx.Node) -> Any:
    val = node.meta.get("val")
    return plait_dtype(val.dtype) if isinstance(val, torch.Tensor) and val.dtype in DTYPES else None


def _fill_dtype_ok(node: torch.fx.Node) -> bool:
    return _dtype_of(node) is not None


@register(aten.full.default, supports=_fill_dtype_ok)
def full(size: list[int], value: Any, dtype: torch.dtype | None = None, device: Any = None, **_: Any) -> Tensor:
    from plait.frontends.torch.partition import current_device

    dt = plait_dtype(dtype) if dtype is not None else (dtypes.float32 if isinstance(value, float) else None)
    return Tensor.full(tuple(size), value, dt, current_device())


@register(aten.scalar_tensor.default, supports=_fill_dtype_ok)
def scalar_tensor(value: Any, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    return full([], value, dtype if dtype is not None else torch.float32)


@register(aten.full_like.default, supports=_fill_dtype_ok)
def full_like(x: Tensor, value: Any, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    return Tensor.full(x.shape, value, plait_dtype(dtype) if dtype is not None else x.dtype, x.device)


@register(aten.zeros_like.default, aten.empty_like.default, supports=_fill_dtype_ok)
def zeros_like(x: Tensor, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    return full_like(x, 0, dtype)


@register(aten.ones_like.default, supports=_fill_dtype_ok)
def ones_like(x: Tensor, dtype: torch.dtype | None = None, **_: Any) -> Tensor:
    return full_like(x, 1, dtype)


@register(aten.fill.Scalar)
def fill(x: Tensor, value: Any) -> Tensor:
    return Tensor.full(x.shape, value, x.dtype, x.device)


@register(aten.masked_fill.Scalar)
def masked_fill(x: Tensor, mask: Tensor, value: Any) -> Tensor:
    return where(mask, Tensor.full((), value, x.dtype, x.device), x)


@register(aten.log1p.default)
def log1p(x: Tensor) -> Tensor:
    return (x + 1.0).log()


@register(aten.expm1.default)
def expm1(x: Tensor) -> Tensor:
    return x.exp() - 1.0
