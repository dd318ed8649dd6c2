"""The Tile language as users write it: indices, tensor references, outputs and contractions.

A `@tile.op` function receives its plait.Tensor arguments as references that can be indexed with affine index
expressions; writing `O[i, j] += A[i, k] * B[k, j]` records a contraction (one graph node). Everything is
checked when the contraction is written, and errors name the index and the expression.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from plait import dtypes
from plait.errors import TileError
from plait.frontends.native.tensor import Tensor
from plait.graph.node import Node
from plait.graph.ops import elementwise as ew
from plait.tile.graph import _rekey, make_node
from plait.tile.kernel import normalize
from plait.tile.spec import AGGS, Aff, Constraint, Spec, fmt, infer_ranges, leaves

_TRACES: list[_Trace] = []


class _Trace:
    def __init__(self, name: str):
        self.name = name
        self.declared: dict[str, int | None] = {}
        self.used: set[str] = set()
        self.names: dict[int, str] = {}

    def check_unused(self) -> None:
        unused = [v for v in self.declared if v not in self.used]
        if unused:
            raise TileError(
                f"tile op {self.name}: index '{unused[0]}' is declared but used in no contraction; remove it or use it"
            )


def _trace(what: str) -> _Trace:
    if not _TRACES:
        raise TileError(f"{what} is only available inside a @tile.op function")
    return _TRACES[-1]


def index(name: str, size: int | None = None) -> Aff:
    """Declare one index. With `size` it ranges over 0..size-1; without, its range is inferred from the
    output and operand dimensions it addresses."""
    tr = _trace("tile.index")
    if not name.isidentifier():
        raise TileError(f"tile op {tr.name}: index name {name!r} is not an identifier")
    if name in tr.declared:
        raise TileError(f"tile op {tr.name}: index '{name}' is declared twice")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise TileError(f"tile op {tr.name}: index '{name}' needs a positive integer size, got {size!r}")
    tr.declared[name] = size
    return Aff(((name, 1),))


def indices(names: str, sizes: dict[str, int] | None = None) -> tuple[Aff, ...]:
    """Declare several indices at once: `n, c, y, x = tile.indices("n c y x")`."""
    sizes = sizes or {}
    return tuple(index(n, sizes.get(n)) for n in names.replace(",", " ").split())


# ---------------------------------------------------------------- values


class Value:
    """A scalar expression inside a contraction: reads of tensors, constants, elementwise math."""

    __slots__ = ("_t", "conds")

    def __init__(self, t: tuple[Any, ...] | None, conds: tuple[Constraint, ...] = ()):
        self._t = t
        self.conds = conds

    @property
    def t(self) -> tuple[Any, ...]:
        assert self._t is not None
        return self._t

    def _bin(self, op: str, other: Any, rev: bool = False) -> Value:
        o = value(other)
        a, b = (o, self) if rev else (self, o)
        return Value((op, a.t, b.t), a.conds + b.conds)

    def __add__(self, o: Any) -> Value:
        return self._bin("add", o)

    def __radd__(self, o: Any) -> Value:
        return self._bin("add", o, True)

    def __sub__(self, o: Any) -> Value:
        return self._bin("sub", o)

    def __rsub__(self, o: Any) -> Value:
        return self._bin("sub", o, True)

    def __mul__(self, o: Any) -> Value:
        return self._bin("mul", o)

    def __rmul__(self, o: Any) -> Value:
        return self._bin("mul", o, True)

    def __truediv__(self, o: Any) -> Value:
        return self._bin("div", o)

    def __rtruediv__(self, o: Any) -> Value:
        return self._bin("div", o, True)

    def __neg__(self) -> Value:
        return Value(("neg", self.t), self.conds)

    def __lt__(self, o: Any) -> Value:
        return self._bin("lt", o)

    def __le__(self, o: Any) -> Value:
        return self._bin("le", o)

    def __gt__(self, o: Any) -> Value:
        return self._bin("gt", o)

    def __ge__(self, o: Any) -> Value:
        return self._bin("ge", o)

    def __eq__(self, o: Any) -> Value:  # type: ignore[override]
        return self._bin("eq", o)

    def __ne__(self, o: Any) -> Value:  # type: ignore[override]
        return self._bin("ne", o)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise TileError(f"the value {fmt(self.t)} has no truth value while tracing; use tile.where(cond, a, b)")

    def constrain(self, *constraints: Constraint) -> Value:
        """Keep only the terms whose indices satisfy every constraint, e.g. `.constrain(i - k >= 0, k < 3)`."""
        for c in constraints:
            if not isinstance(c, Constraint):
                raise TileError(f"constrain() takes index comparisons like `k < 3`, got {c!r}")
        return Value(self.t, self.conds + tuple(constraints))


def value(x: Any) -> Value:
    if isinstance(x, Value):
        return x
    if isinstance(x, Aff):
        raise TileError(f"index expression {x} used as a value; indices may only address tensors")
    if isinstance(x, Ref):
        raise TileError(f"tensor {x.name} used as a value inside a contraction; index it, e.g. {x.name}[i, j]")
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return Value(("const", float(x)))
    raise TileError(f"cannot use {type(x).__name__} {x!r} in a contraction expression")


def _unary(op: str) -> Callable[[Any], Any]:
    def f(x: Any) -> Any:
        if isinstance(x, (Ref, Tensor)):
            t = _tensor(x)
            return Ref(getattr(t, op)().node, f"{op}({_name(x)})")
        v = value(x)
        return Value((op, v.t), v.conds)

    f.__name__ = op
    f.__doc__ = f"Elementwise {op}: of a value inside a contraction, or of a whole tensor (fused with its neighbours)."
    return f


exp, log, sqrt, abs, relu, tanh, sigmoid = (_unary(n) for n in ("exp", "log", "sqrt", "abs", "relu", "tanh", "sigmoid"))


def maximum(a: Any, b: Any) -> Value:
    """Elementwise maximum of two values inside a contraction."""
    return value(a)._bin("max", b)


def minimum(a: Any, b: Any) -> Value:
    """Elementwise minimum of two values inside a contraction."""
    return value(a)._bin("min", b)


def where(cond: Any, a: Any, b: Any) -> Value:
    """`a` where `cond` is non-zero, else `b` (all values inside a contraction)."""
    c, x, y = value(cond), value(a), value(b)
    return Value(("where", c.t, x.t, y.t), c.conds + x.conds + y.conds)


class _Agg:
    def __init__(self, agg: str, v: Any):
        self.agg = agg
        self.value = value(v)


def sum(v: Any) -> _Agg:
    """`O[...] = tile.sum(expr)` is the same as `O[...] += expr`."""
    return _Agg("sum", v)


def prod(v: Any) -> _Agg:
    """`O[...] = tile.prod(expr)` is the same as `O[...] *= expr`."""
    return _Agg("prod", v)


def max(v: Any) -> _Agg:
    """`O[...] = tile.max(expr)`: the largest term over the reduction indices."""
    return _Agg("max", v)


def min(v: Any) -> _Agg:
    """`O[...] = tile.min(expr)`: the smallest term over the reduction indices."""
    return _Agg("min", v)


# ---------------------------------------------------------------- tensors


def _tensor(x: Any) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, Ref):
        return Tensor(x.node)
    raise TileError(f"expected a tensor, got {type(x).__name__}")


def _name(x: Any) -> str:
    return x.name if isinstance(x, Ref) else "tensor"


def _key(idx: Any, where: str) -> tuple[Aff, ...]:
    idx = idx if isinstance(idx, tuple) else (idx,)
    return tuple(Aff.of(a, where) for a in idx)


class Ref:
    """A tensor inside a tile op. `R[i, k + 1]` reads it; arithmetic on whole references (`O + bias`) builds
    ordinary plait elementwise ops, which fuse with their neighbours."""

    __add__: Callable[[Ref, Any], Ref]
    __radd__: Callable[[Ref, Any], Ref]
    __sub__: Callable[[Ref, Any], Ref]
    __rsub__: Callable[[Ref, Any], Ref]
    __mul__: Callable[[Ref, Any], Ref]
    __rmul__: Callable[[Ref, Any], Ref]
    __truediv__: Callable[[Ref, Any], Ref]
    __rtruediv__: Callable[[Ref, Any], Ref]
    __pow__: Callable[[Ref, Any], Ref]
    __neg__: Callable[[Ref], Ref]

    def __init__(self, node: Node | None, name: str):
        self._node = node
        self.name = name
        if _TRACES and node is not None:
            _TRACES[-1].names.setdefault(node.uid, name)

    @property
    def node(self) -> Node:
        assert self._node is not None
        return self._node

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def dtype(self) -> dtypes.DType:
        return self.node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def tensor(self) -> Tensor:
        return Tensor(self.node)

    def _read(self, idx: Any, fill: float | None) -> Value:
        key = _key(idx, f"index of {self.name}")
        if len(key) != self.ndim:
            raise TileError(
                f"{self.name}[{', '.join(map(str, key))}] has {len(key)} indices but {self.name} has shape {self.shape}; "
                f"give one index expression per dimension"
            )
        return Value(("acc", self.node, key, fill))

    def __getitem__(self, idx: Any) -> Value:
        return self._read(idx, None)

    def padded(self, value: float = 0.0) -> _Padded:
        """Reads through the result yield `value` outside the tensor (zero padding by default) instead of
        excluding the term."""
        return _Padded(self, float(value))

    def reshape(self, *shape: Any) -> Ref:
        return Ref(self.tensor.reshape(*shape).node, self.name)

    def permute(self, *perm: Any) -> Ref:
        return Ref(self.tensor.permute(*perm).node, self.name)

    def __repr__(self) -> str:
        return f"tile.Ref({self.name}, shape={self.shape})"


def _ref_binary(op: str) -> Callable[[Ref, Any], Ref]:
    def f(self: Ref, other: Any) -> Ref:
        o = _tensor(other) if isinstance(other, (Ref, Tensor)) else other
        return Ref(getattr(self.tensor, op)(o).node, self.name)

    return f


for _op in (
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__pow__",
):
    setattr(Ref, _op, _ref_binary(_op))
setattr(Ref, "__neg__", lambda self: Ref((-self.tensor).node, self.name))  # noqa: B010


class _Padded:
    def __init__(self, ref: Ref, fill: float):
        self.ref, self.fill = ref, fill

    def __getitem__(self, idx: Any) -> Value:
        return self.ref._read(idx, self.fill)


class _Pending:
    def __init__(self, agg: str, idx: tuple[Aff, ...], v: Any):
        self.agg, self.idx, self.value = agg, idx, value(v)


class _OutRead(Value):
    """`O[i, j]` on an output: the target of `+=` / `*=`, or (inside another expression) a read of O so far."""

    __slots__ = ("idx", "out")

    def __init__(self, out: Output, idx: tuple[Aff, ...]):
        super().__init__(None)
        self.out, self.idx = out, idx

    @property
    def t(self) -> tuple[Any, ...]:
        return self.out._read(self.idx, None).t

    def __iadd__(self, v: Any) -> _Pending:  # type: ignore[misc,override]
        return _Pending("sum", self.idx, v)

    def __imul__(self, v: Any) -> _Pending:  # type: ignore[misc,override]
        return _Pending("prod", self.idx, v)


class Output(Ref):
    """A tensor that contractions write: `O = tile.output((m, n))`, then `O[i, j] += ...`."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, name: str):
        super().__init__(None, name)
        self._shape = tuple(int(s) for s in shape)
        self._dtype = dtypes.to_dtype(dtype) if dtype is not None else None
        self.agg: str | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def node(self) -> Node:
        if self._node is None:
            raise TileError(f"output {self.name} is read before any contraction writes it")
        return self._node

    def __getitem__(self, idx: Any) -> Value:
        key = _key(idx, f"index of {self.name}")
        return _OutRead(self, key)

    def __setitem__(self, idx: Any, v: Any) -> None:
        key = _key(idx, f"index of {self.name}")
        if isinstance(v, _Pending):
            if v.idx != key:
                raise TileError(f"{self.name}[...] op= used different indices on the two sides")
            agg, val = v.agg, v.value
        elif isinstance(v, _Agg):
            agg, val = v.agg, v.value
        else:
            agg, val = "assign", value(v)
        self._record(agg, key, val)

    def _record(self, agg: str, key: tuple[Aff, ...], val: Value) -> None:
        tr = _trace("a contraction")
        assert agg in AGGS
        if len(key) != len(self._shape):
            raise TileError(
                f"{self.name}[{', '.join(map(str, key))}]: {len(key)} indices for output {self.name} of shape {self._shape}"
            )
        expr = val.t
        order: list[Node] = []
        for lf in leaves(expr):
            if all(n is not lf[1] for n in order):
                order.append(lf[1])
        names = tuple(tr.names.get(n.uid, f"x{i}") for i, n in enumerate(order))
        keyed = _rekey(expr, {id(n): i for i, n in enumerate(order)})
        text = f"{self.name}[{', '.join(map(str, key))}] {_AGG_TEXT[agg]} {fmt(keyed, names)}"
        if self.agg is not None and self.agg != agg:
            raise TileError(
                f"aggregation mixed within output {self.name}: it is written with {self.agg} and now with {agg} in {text}; "
                "use one aggregation per output (write a second output and combine them)"
            )
        if not order:
            raise TileError(f"{text}: the expression reads no tensor; a contraction needs at least one input")
        devices = {n.device for n in order}
        if len(devices) > 1:
            raise TileError(f"{text}: operands live on different devices {sorted(devices)}; move them with .to()")
        allvars = {v for a in key for v in a.vars} | {v for lf in leaves(keyed) for a in lf[2] for v in a.vars}
        allvars |= {v for c in val.conds for v in c.expr.vars}
        for v in sorted(allvars):
            if v not in tr.declared:
                raise TileError(f"index '{v}' in {text} was not declared in this tile op; declare it with tile.index")
        declared = {v: s for v, s in tr.declared.items() if s is not None and v in allvars}
        shapes = tuple(n.shape for n in order)
        ranges = infer_ranges(text, self.name, self._shape, key, keyed, val.conds, names, shapes, declared)
        dt = self._dtype or _promote([n.dtype for n in order])
        self._dtype = dt
        spec = Spec(tr.name, self.name, self._shape, agg, key, ranges, val.conds, keyed, names, shapes)
        if agg == "assign" and normalize(spec).loops:
            loops = ", ".join(f"'{v}'" for v, _, _ in normalize(spec).loops)
            raise TileError(
                f"{text}: plain assignment, but index {loops} does not appear in the output, so several terms would "
                "write one element; aggregate them with +=, *=, tile.max(...) or tile.min(...)"
            )
        node = make_node(tr.name, self.name, self._shape, agg, key, ranges, val.conds, expr, tr.names, dt)
        tr.used |= allvars
        if self._node is not None:
            comb = {"sum": "add", "assign": "add", "prod": "mul", "max": "maximum", "min": "minimum"}[agg]
            node = ew.binary(comb, self._node, node)
        self._node = node
        self.agg = agg
        tr.names[node.uid] = self.name


_AGG_TEXT = {"sum": "+=", "prod": "*=", "assign": "=", "max": "= max", "min": "= min"}


def _promote(dts: list[dtypes.DType]) -> dtypes.DType:
    dt = dts[0]
    for d in dts[1:]:
        dt = dtypes.promote(dt, d)
    return dt


def output(shape: Any, dtype: Any = None, name: str = "O") -> Output:
    """Declare an output of `shape`; its dtype defaults to the promoted dtype of what the first contraction reads."""
    tr = _trace("tile.output")
    shp = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    for s in shp:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise TileError(f"tile op {tr.name}: output {name} needs integer sizes >= 0, got shape {shp}")
    return Output(shp, dtype, name)


def input(t: Any, name: str = "X") -> Ref:
    """Use a plait.Tensor (made inside the op, or captured) as an operand of contractions."""
    _trace("tile.input")
    return Ref(_tensor(t).node, name)


def _result(x: Any) -> Any:
    if isinstance(x, (tuple, list)):
        return type(x)(_result(v) for v in x)
    if isinstance(x, Ref):
        return Tensor(x.node)
    return x


def op(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Make a function of plait Tensors written in Tile into a plait op (a decorator).

    Tensor arguments arrive as `Ref`s named after their parameters; other arguments (ints, tuples) pass
    through. The function returns outputs (or tensors made from them); the op returns plait Tensors.
    """

    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(f)
        op_name = name or f.__name__

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)
            tr = _Trace(op_name)
            _TRACES.append(tr)
            try:
                for k, v in list(bound.arguments.items()):
                    if isinstance(v, Tensor):
                        bound.arguments[k] = Ref(v.node, k)
                res = f(*bound.args, **bound.kwargs)
                tr.check_unused()
            finally:
                _TRACES.pop()
            return _result(res)

        return wrapper

    return deco(fn) if fn is not None else deco
