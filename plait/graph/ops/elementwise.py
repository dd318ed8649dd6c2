"""Elementwise ops: leaves (const), unary, binary, ternary (where) and cast.

Node-level constructors require equal shapes; broadcasting and dtype promotion happen in the Tensor frontend.
A render function receives the renderer, the output dtype, the source dtypes and the rendered source values.
"""

from __future__ import annotations

import math
from typing import Any

from plait import dtypes
from plait.dtypes import DType
from plait.errors import DTypeError, ShapeError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register

# ---------------------------------------------------------------- constructors


def const(value: Any, shape: tuple[int, ...], dtype: DType, device: str) -> Node:
    """A constant broadcast to `shape` (a scalar node expanded, so it costs no memory)."""
    from plait.graph.ops.movement import expand, reshape

    if dtype == dtypes.bool_:
        value = bool(value)
    elif dtype.is_int:
        value = int(value)
    else:
        value = float(value)
    node = Node("const", (), value, (), dtype, device)
    if not shape:
        return node
    return expand(reshape(node, (1,) * len(shape)), shape)


def unary(op: str, x: Node) -> Node:
    out = x.dtype
    if op in _FLOAT_UNARY and not x.dtype.is_float:
        raise DTypeError(f"{op} needs a floating-point input, got {x.dtype.name} with shape {x.shape}; cast first")
    if op == "bitwise_not" and x.dtype.is_float:
        raise DTypeError(f"bitwise_not needs an integer or bool input, got {x.dtype.name} with shape {x.shape}")
    if op == "logical_not":
        out = dtypes.bool_
    return Node(op, (x,), None, x.shape, out, x.device)


def binary(op: str, a: Node, b: Node) -> Node:
    if a.shape != b.shape:
        raise ShapeError(f"{op}: shapes {a.shape} and {b.shape} differ (broadcast them first)")
    if a.dtype != b.dtype:
        raise DTypeError(f"{op}: dtypes {a.dtype.name} and {b.dtype.name} differ (cast one first)")
    if op in _BITWISE and a.dtype.is_float:
        raise DTypeError(f"{op}: needs integer or bool inputs, got {a.dtype.name} with shape {a.shape}")
    out = dtypes.bool_ if op in _COMPARE or op in ("logical_and", "logical_or") else a.dtype
    return Node(op, (a, b), None, a.shape, out, a.device)


def where(c: Node, a: Node, b: Node) -> Node:
    if not (c.shape == a.shape == b.shape):
        raise ShapeError(f"where: shapes {c.shape}, {a.shape}, {b.shape} differ (broadcast them first)")
    if a.dtype != b.dtype:
        raise DTypeError(f"where: branch dtypes {a.dtype.name} and {b.dtype.name} differ")
    if c.dtype != dtypes.bool_:
        c = cast(c, dtypes.bool_)
    return Node("where", (c, a, b), None, a.shape, a.dtype, a.device)


def cast(x: Node, dtype: DType) -> Node:
    if x.dtype == dtype:
        return x
    return Node("cast", (x,), None, x.shape, dtype, x.device)


def zeros_like(x: Node) -> Node:
    return const(0, x.shape, x.dtype, x.device)


def add(a: Node, b: Node) -> Node:
    return binary("add", a, b)


def sub(a: Node, b: Node) -> Node:
    return binary("sub", a, b)


def mul(a: Node, b: Node) -> Node:
    return binary("mul", a, b)


def div(a: Node, b: Node) -> Node:
    return binary("div", a, b)


def neg(a: Node) -> Node:
    return unary("neg", a)


def scalar_like(x: Node, v: float) -> Node:
    return const(v, x.shape, x.dtype, x.device)


# ---------------------------------------------------------------- gradients (node -> grad of output -> grads of srcs)


def _vjp_unary(f: Any) -> Any:
    return lambda n, g: (f(n, n.srcs[0], g),)


_UNARY_GRADS = {
    "neg": lambda n, x, g: neg(g),
    "exp": lambda n, x, g: mul(g, n),
    "log": lambda n, x, g: div(g, x),
    "sqrt": lambda n, x, g: div(g, mul(scalar_like(n, 2.0), n)),
    "abs": lambda n, x, g: mul(g, unary("sign", x)),
    "relu": lambda n, x, g: where(binary("cmpgt", x, zeros_like(x)), g, zeros_like(g)),
    "sigmoid": lambda n, x, g: mul(g, mul(n, sub(scalar_like(n, 1.0), n))),
    "tanh": lambda n, x, g: mul(g, sub(scalar_like(n, 1.0), mul(n, n))),
    "recip": lambda n, x, g: neg(mul(g, mul(n, n))),
    "sin": lambda n, x, g: mul(g, unary("cos", x)),
    "cos": lambda n, x, g: neg(mul(g, unary("sin", x))),
    "erf": lambda n, x, g: mul(g, mul(scalar_like(x, 2.0 / math.sqrt(math.pi)), unary("exp", neg(mul(x, x))))),
    "floor": lambda n, x, g: zeros_like(g),
    "ceil": lambda n, x, g: zeros_like(g),
    "sign": lambda n, x, g: zeros_like(g),
}


def _pow_grad(n: Node, g: Node) -> tuple[Node, Node]:
    a, b = n.srcs
    da = mul(g, mul(b, binary("pow", a, sub(b, scalar_like(b, 1.0)))))
    safe_log = unary("log", where(binary("cmpgt", a, zeros_like(a)), a, scalar_like(a, 1.0)))
    db = mul(g, mul(n, safe_log))
    return da, db


def _minmax_grad(n: Node, g: Node) -> tuple[Node, Node]:
    a, b = n.srcs
    pick_a = binary("cmpeq", n, a)
    pick_b = binary("cmpeq", n, b)
    both = binary("logical_and", pick_a, pick_b)
    half = where(both, mul(g, scalar_like(g, 0.5)), g)
    zero = zeros_like(g)
    return where(pick_a, half, zero), where(pick_b, half, zero)


_BINARY_GRADS = {
    "add": lambda n, g: (g, g),
    "sub": lambda n, g: (g, neg(g)),
    "mul": lambda n, g: (mul(g, n.srcs[1]), mul(g, n.srcs[0])),
    "div": lambda n, g: (div(g, n.srcs[1]), neg(div(mul(g, n), n.srcs[1]))),
    "pow": _pow_grad,
    "maximum": _minmax_grad,
    "minimum": _minmax_grad,
}


def _where_grad(n: Node, g: Node) -> tuple[None, Node, Node]:
    c = n.srcs[0]
    zero = zeros_like(g)
    return None, where(c, g, zero), where(c, zero, g)


def _cast_grad(n: Node, g: Node) -> tuple[Node | None]:
    x = n.srcs[0]
    return (cast(g, x.dtype) if x.dtype.is_float and n.dtype.is_float else None,)


# ---------------------------------------------------------------- lowering (C-style expressions)

_BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor")
_FLOAT_UNARY = {"exp", "log", "sqrt", "sigmoid", "tanh", "recip", "sin", "cos", "erf", "floor", "ceil"}
_COMPARE = {"cmplt": "<", "cmple": "<=", "cmpgt": ">", "cmpge": ">=", "cmpeq": "==", "cmpne": "!="}

_UNARY_RENDER = {
    "neg": lambda r, dt, x: f"(-{x})",
    "exp": lambda r, dt, x: f"{r.fn('exp')}({x})",
    "log": lambda r, dt, x: f"{r.fn('log')}({x})",
    "sqrt": lambda r, dt, x: f"{r.fn('sqrt')}({x})",
    "abs": lambda r, dt, x: f"{r.fn('fabs')}({x})" if dt.is_float else f"(({x}) < 0 ? -({x}) : ({x}))",
    "relu": lambda r, dt, x: f"(({x}) < 0 ? 0 : ({x}))",  # NaN passes through, as in torch and NumPy
    "sigmoid": lambda r, dt, x: f"(1.0f / (1.0f + {r.fn('exp')}(-({x}))))",
    "tanh": lambda r, dt, x: f"{r.fn('tanh')}({x})",
    "recip": lambda r, dt, x: f"(1.0f / ({x}))",
    "sin": lambda r, dt, x: f"{r.fn('sin')}({x})",
    "cos": lambda r, dt, x: f"{r.fn('cos')}({x})",
    "erf": lambda r, dt, x: f"{r.fn('erf')}({x})",
    "floor": lambda r, dt, x: f"{r.fn('floor')}({x})",
    "ceil": lambda r, dt, x: f"{r.fn('ceil')}({x})",
    "sign": lambda r, dt, x: f"(({x}) > 0 ? 1 : (({x}) < 0 ? -1 : 0))",
    "logical_not": lambda r, dt, x: f"(!({x}))",
    "bitwise_not": lambda r, dt, x: f"(!({x}))" if dt == dtypes.bool_ else f"(~({x}))",
}


def _mod(r: Any, dt: DType, a: str, b: str) -> str:
    """Python/NumPy modulo: the result takes the divisor's sign. An integer modulo by zero gives 0 (as NumPy)
    instead of trapping."""
    if dt.is_float:
        m = f"{r.fn('fmod')}({a}, {b})"
        return f"(({m}) != 0 && (({m}) < 0) != (({b}) < 0) ? ({m}) + ({b}) : ({m}))"
    m = f"(({a}) % ({b}))"
    return f"(({b}) == 0 ? 0 : {m} != 0 && ({m} < 0) != (({b}) < 0) ? {m} + ({b}) : {m})"


def _pow(r: Any, dt: DType, a: str, b: str) -> str:
    """Float pow, or exact integer pow by squaring (a negative exponent truncates 1/a**-b to an integer as
    PyTorch does; NumPy raises instead)."""
    if dt.is_float:
        return f"{r.fn('pow')}({a}, {b})"
    return f"plait_ipow((long)({a}), (long)({b}))"


def _minmax(sym: str) -> Any:
    """maximum/minimum that propagate NaN like NumPy and PyTorch (a plain comparison would drop it)."""

    def render(r: Any, dt: DType, a: str, b: str) -> str:
        nan = f" || ({a}) != ({a})" if dt.is_float else ""
        return f"((({a}) {sym} ({b}){nan}) ? ({a}) : ({b}))"

    return render


def _binary_render(op: str) -> Any:
    if op in _COMPARE:
        sym = _COMPARE[op]
        return lambda r, dt, a, b: f"(({a}) {sym} ({b}))"
    table = {
        "add": lambda r, dt, a, b: f"(({a}) + ({b}))",
        "sub": lambda r, dt, a, b: f"(({a}) - ({b}))",
        "mul": lambda r, dt, a, b: f"(({a}) * ({b}))",
        "div": lambda r, dt, a, b: f"(({a}) / ({b}))",
        "pow": _pow,
        "maximum": _minmax(">"),
        "minimum": _minmax("<"),
        "logical_and": lambda r, dt, a, b: f"(({a}) && ({b}))",
        "logical_or": lambda r, dt, a, b: f"(({a}) || ({b}))",
        "bitwise_and": lambda r, dt, a, b: f"(({a}) & ({b}))",
        "bitwise_or": lambda r, dt, a, b: f"(({a}) | ({b}))",
        "bitwise_xor": lambda r, dt, a, b: f"(({a}) ^ ({b}))",
        "mod": _mod,
    }
    return table[op]


UNARY_OPS = tuple(_UNARY_RENDER)
BINARY_OPS = (
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    "logical_and",
    "logical_or",
    "mod",
    *_BITWISE,
    *_COMPARE,
)

for _name, _render in _UNARY_RENDER.items():
    _grad = _UNARY_GRADS.get(_name)
    _cost = 4 if _name in _FLOAT_UNARY else 1
    register(OpDef(_name, "elementwise", _vjp_unary(_grad) if _grad else None, _render, _cost))
for _name in BINARY_OPS:
    register(OpDef(_name, "elementwise", _BINARY_GRADS.get(_name), _binary_render(_name), 4 if _name == "pow" else 1))
register(OpDef("where", "elementwise", _where_grad, lambda r, dt, c, a, b: f"(({c}) ? ({a}) : ({b}))"))
register(OpDef("cast", "elementwise", _cast_grad, None))
register(OpDef("const", "leaf"))
register(OpDef("buffer", "leaf"))
register(OpDef("input", "leaf"))
