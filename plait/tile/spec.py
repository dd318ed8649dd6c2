"""The Tile IR: affine index expressions, value expressions and the frozen contraction `Spec` held by a node.

A contraction is `O[out_idx] AGG= expr` over index variables with integer ranges, under range constraints.
Value expressions are nested tuples: ("acc", operand, idx, fill) reads an operand (fill None: a read outside
the operand excludes the whole term; a float: the read yields that value), ("const", v), or (op, *children).
Everything here is hashable and deterministic, so equal ops give equal specs and byte-identical kernels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plait.errors import TileError

AGGS = ("sum", "max", "min", "prod", "assign")
UNARY = ("neg", "exp", "log", "sqrt", "abs", "relu", "tanh", "sigmoid")
BINARY = ("add", "sub", "mul", "div", "max", "min", "eq", "ne", "lt", "le", "gt", "ge")
_SYM = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
}


@dataclass(frozen=True)
class Aff:
    """An affine index expression: sum(coef * index) + const, with integer coefficients.

    Arithmetic with ints and other Affs stays affine; anything else (index * index, division, floats) is a
    TileError at once. Comparisons build range constraints for `Value.constrain`.
    """

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(x: Any, where: str = "an index expression") -> Aff:
        if isinstance(x, Aff):
            return x
        if isinstance(x, bool) or not isinstance(x, int):
            raise TileError(
                f"{where}: {x!r} is not an index or an integer; index expressions must be affine with integer coefficients"
            )
        return Aff((), int(x))

    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    def coef(self, v: str) -> int:
        return dict(self.terms).get(v, 0)

    def _combine(self, other: Any, sign: int) -> Aff:
        o = Aff.of(other, f"{self} {'+' if sign > 0 else '-'} {other!r}")
        acc = dict(self.terms)
        for v, c in o.terms:
            acc[v] = acc.get(v, 0) + sign * c
        return Aff(tuple(sorted((v, c) for v, c in acc.items() if c)), self.const + sign * o.const)

    def __add__(self, other: Any) -> Aff:
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Aff:
        return self._combine(other, -1)

    def __rsub__(self, other: Any) -> Aff:
        return Aff.of(other)._combine(self, -1)

    def __neg__(self) -> Aff:
        return Aff((), 0)._combine(self, -1)

    def __mul__(self, other: Any) -> Aff:
        if isinstance(other, Aff):
            if not other.terms:
                other = other.const
            elif not self.terms:
                return other * self.const
            else:
                raise TileError(
                    f"non-affine index expression ({self}) * ({other}): an index may only be multiplied by an integer"
                )
        if isinstance(other, bool) or not isinstance(other, int):
            raise TileError(
                f"non-affine index expression ({self}) * {other!r}: an index may only be multiplied by an integer"
            )
        return Aff(tuple((v, c * other) for v, c in self.terms if c * other), self.const * other)

    __rmul__ = __mul__

    def _nonaffine(self, op: str, other: Any) -> TileError:
        return TileError(
            f"non-affine index expression ({self}) {op} {other!r}: only +, - and multiplication by an integer are allowed"
        )

    def __truediv__(self, other: Any) -> Aff:
        raise self._nonaffine("/", other)

    def __floordiv__(self, other: Any) -> Aff:
        raise self._nonaffine("//", other)

    def __mod__(self, other: Any) -> Aff:
        raise self._nonaffine("%", other)

    def __pow__(self, other: Any) -> Aff:
        raise self._nonaffine("**", other)

    def __rtruediv__(self, other: Any) -> Aff:
        raise self._nonaffine("/", other)

    def __rfloordiv__(self, other: Any) -> Aff:
        raise self._nonaffine("//", other)

    def __lt__(self, other: Any) -> Constraint:
        return Constraint.make(self - other, None, 0)

    def __le__(self, other: Any) -> Constraint:
        return Constraint.make(self - other, None, 1)

    def __gt__(self, other: Any) -> Constraint:
        return Constraint.make(self - other, 1, None)

    def __ge__(self, other: Any) -> Constraint:
        return Constraint.make(self - other, 0, None)

    def __bool__(self) -> bool:
        raise TileError(f"index expression {self} used as a truth value; use it inside an access or a constraint")

    def __str__(self) -> str:
        parts = []
        for v, c in self.terms:
            s = v if abs(c) == 1 else f"{v}*{abs(c)}"
            parts.append(("- " if c < 0 else "+ ") + s)
        if self.const or not parts:
            parts.append(("- " if self.const < 0 else "+ ") + str(abs(self.const)))
        out = " ".join(parts)
        return out[2:] if out.startswith("+ ") else "-" + out[2:]

    def interval(self, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """The smallest and largest value over index ranges [lo, hi) (inclusive bounds returned)."""
        lo = hi = self.const
        for v, c in self.terms:
            a, b = ranges[v]
            lo += min(c * a, c * (b - 1))
            hi += max(c * a, c * (b - 1))
        return lo, hi


@dataclass(frozen=True)
class Constraint:
    """lo <= expr < hi (either bound may be None)."""

    expr: Aff
    lo: int | None
    hi: int | None

    @staticmethod
    def make(e: Aff, lo: int | None, hi: int | None) -> Constraint:
        # move the constant to the bounds so `k + 1 < 5` and `k < 4` are the same constraint
        c = e.const
        base = Aff(e.terms, 0)
        if not base.terms:
            raise TileError(f"constraint on the constant {e}: a constraint needs at least one index")
        return Constraint(base, None if lo is None else lo - c, None if hi is None else hi - c)

    def __bool__(self) -> bool:
        raise TileError(
            f"constraint {self} used as a truth value (a chained comparison like `0 <= i < n`?); "
            "pass each bound as its own constraint: .constrain(i >= 0, i < n)"
        )

    def __str__(self) -> str:
        lo = "" if self.lo is None else f"{self.lo} <= "
        hi = "" if self.hi is None else f" < {self.hi}"
        return f"{lo}{self.expr}{hi}"


@dataclass(frozen=True)
class Spec:
    """One contraction: `out[out_idx] agg= expr` for every index assignment in `ranges` meeting `constraints`."""

    name: str
    out_name: str
    out_shape: tuple[int, ...]
    agg: str
    out_idx: tuple[Aff, ...]
    ranges: tuple[tuple[str, int, int], ...]  # (index, lo, hi): lo <= index < hi
    constraints: tuple[Constraint, ...]
    expr: tuple[Any, ...]
    names: tuple[str, ...]  # operand names, for messages
    shapes: tuple[tuple[int, ...], ...]

    @property
    def range_map(self) -> dict[str, tuple[int, int]]:
        return {v: (lo, hi) for v, lo, hi in self.ranges}

    def __str__(self) -> str:
        op = {"sum": "+=", "prod": "*=", "assign": "="}.get(self.agg, f"= {self.agg} over")
        return f"{self.out_name}[{', '.join(map(str, self.out_idx))}] {op} {fmt(self.expr, self.names)}"


# ---------------------------------------------------------------- expression helpers


def leaves(e: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Distinct operand reads of e, in first-visit order."""
    out: list[tuple[Any, ...]] = []
    stack = [e]
    while stack:
        t = stack.pop()
        if t[0] == "acc":
            if t not in out:
                out.append(t)
        elif t[0] != "const":
            stack.extend(reversed(t[1:]))
    return out


def fmt(e: tuple[Any, ...], names: tuple[str, ...] | None = None) -> str:
    """Render a value expression the way a user wrote it, for error messages and docs."""
    h = e[0]
    if h == "acc":
        name = names[e[1]] if names else str(e[1])
        pad = "" if e[3] is None else f".padded({e[3]})"
        return f"{name}{pad}[{', '.join(map(str, e[2]))}]"
    if h == "const":
        return repr(e[1])
    if h in _SYM:
        return f"({fmt(e[1], names)} {_SYM[h]} {fmt(e[2], names)})"
    return f"{h}({', '.join(fmt(c, names) for c in e[1:])})"


def remap(e: tuple[Any, ...], pos: dict[Any, int]) -> tuple[Any, ...]:
    """Replace each read's operand key by its position in `pos`."""
    if e[0] == "acc":
        return ("acc", pos[e[1]], e[2], e[3])
    if e[0] == "const":
        return e
    return (e[0], *(remap(c, pos) for c in e[1:]))


def spec_vars(out_idx: tuple[Aff, ...], expr: tuple[Any, ...], constraints: tuple[Constraint, ...]) -> list[str]:
    seen: list[str] = []
    for a in out_idx:
        seen += [v for v in a.vars if v not in seen]
    for lf in leaves(expr):
        for a in lf[2]:
            seen += [v for v in a.vars if v not in seen]
    for c in constraints:
        seen += [v for v in c.expr.vars if v not in seen]
    return seen


# ---------------------------------------------------------------- validation and range inference


def _where(name: str, idx: tuple[Aff, ...], d: int) -> str:
    return f"dimension {d} of {name}[{', '.join(map(str, idx))}]"


def infer_ranges(
    text: str,
    out_name: str,
    out_shape: tuple[int, ...],
    out_idx: tuple[Aff, ...],
    expr: tuple[Any, ...],
    constraints: tuple[Constraint, ...],
    names: tuple[str, ...],
    shapes: tuple[tuple[int, ...], ...],
    declared: dict[str, int],
) -> tuple[tuple[str, int, int], ...]:
    """Give every index a range [lo, hi): its declared size, else the positions for which every output or
    unpadded operand dimension addressed by that index alone (times an integer, plus a constant) stays in
    bounds. Indices that only appear combined with others must be declared. Checks that shapes agree."""
    dims: list[tuple[Aff, int, str]] = [
        (a, s, _where(out_name, out_idx, d)) for d, (a, s) in enumerate(zip(out_idx, out_shape))
    ]
    for lf in leaves(expr):
        shape = shapes[lf[1]]
        for d, (a, s) in enumerate(zip(lf[2], shape)):
            if not a.terms and not (0 <= a.const < s) and lf[3] is None:
                raise TileError(
                    f"constant index {a.const} is out of range for {_where(names[lf[1]], lf[2], d)} of size {s} in {text}; "
                    "use an index in 0..size-1 or read through .padded()"
                )
            if lf[3] is None:
                dims.append((a, s, _where(names[lf[1]], lf[2], d)))
    for d, (a, s) in enumerate(zip(out_idx, out_shape)):
        if not a.terms and not (0 <= a.const < s):
            raise TileError(
                f"constant index {a.const} is out of range for {_where(out_name, out_idx, d)} of size {s} in {text}"
            )
    # plain uses of one index must agree on its size
    exact: dict[str, tuple[int, str]] = {}
    for a, s, where in dims:
        if len(a.terms) == 1 and a.terms[0][1] == 1 and a.const == 0:
            v = a.terms[0][0]
            if v in declared:
                continue
            if v in exact and exact[v][0] != s:
                raise TileError(
                    f"shapes cannot agree: index '{v}' runs over {exact[v][0]} in {exact[v][1]} but over {s} in {where} "
                    f"({text}); fix the shapes or give '{v}' an explicit range"
                )
            exact.setdefault(v, (s, where))
    ranges: dict[str, tuple[int, int]] = {v: (0, n) for v, n in declared.items()}
    allv = spec_vars(out_idx, expr, constraints)
    found: dict[str, tuple[int, int]] = {}
    for a, s, _ in dims:
        if len(a.terms) != 1 or a.vars[0] in ranges:
            continue
        v, c = a.terms[0]
        # 0 <= c*v + const <= s-1
        lo_t, hi_t = -a.const, s - 1 - a.const
        lo, hi = (-(-lo_t // c), hi_t // c) if c > 0 else (-(-hi_t // c), lo_t // c)
        old = found.get(v, (lo, hi + 1))
        found[v] = (max(old[0], lo), min(old[1], hi + 1))
    ranges.update(found)
    for v in allv:
        if v not in ranges:
            raise TileError(
                f"index '{v}' is unbound in {text}: no output or operand dimension fixes its range; "
                f"give it a range with tile.index('{v}', n) (it only appears combined with other indices)"
            )
        lo, hi = ranges[v]
        if hi <= lo:
            raise TileError(
                f"index '{v}' has an empty range [{lo}, {hi}) in {text}; the shapes leave no valid position"
            )
    return tuple((v, *ranges[v]) for v in allv)


# ---------------------------------------------------------------- expression algebra (used by the gradient)


def const(v: float) -> tuple[Any, ...]:
    return ("const", float(v))


def mk(op: str, *xs: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """Build op(*xs) where None means the zero expression, simplifying the zeros and ones away."""
    a = xs[0]
    b = xs[1] if len(xs) > 1 else None
    if op == "add":
        return b if a is None else a if b is None else ("add", a, b)
    if op == "sub":
        return a if b is None else mk("neg", b) if a is None else ("sub", a, b)
    if op == "neg":
        return None if a is None else ("neg", a)
    if op == "mul":
        if a is None or b is None:
            return None
        if a == const(1):
            return b
        return a if b == const(1) else ("mul", a, b)
    if op == "div":
        return None if a is None else ("div", a, b)
    return (op, *xs)


def derivative(e: tuple[Any, ...], leaf: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """d e / d leaf as an expression (None: identically zero)."""
    h = e[0]
    if h == "acc":
        return const(1) if e == leaf else None
    if h == "const" or h in ("eq", "ne", "lt", "le", "gt", "ge"):
        return None
    a = e[1]
    da = derivative(a, leaf)
    if h in UNARY:
        if da is None:
            return None
        local = {
            "neg": const(-1),
            "exp": e,
            "log": ("div", const(1), a),
            "sqrt": ("div", const(0.5), e),
            "abs": ("sub", ("gt", a, const(0)), ("lt", a, const(0))),
            "relu": ("gt", a, const(0)),
            "tanh": ("sub", const(1), ("mul", e, e)),
            "sigmoid": ("mul", e, ("sub", const(1), e)),
        }[h]
        return mk("mul", da, local)
    if h == "where":
        d1, d2 = derivative(e[2], leaf), derivative(e[3], leaf)
        if d1 is None and d2 is None:
            return None
        return ("where", a, d1 or const(0), d2 or const(0))
    b = e[2]
    db = derivative(b, leaf)
    if h in ("add", "sub"):
        return mk(h, da, db)
    if h == "mul":
        return mk("add", mk("mul", da, b), mk("mul", a, db))
    if h == "div":
        return mk("sub", mk("div", da, b), mk("div", mk("mul", a, db), ("mul", b, b)))
    if h in ("max", "min"):
        if da is None and db is None:
            return None
        pick_a = ("ge", a, b) if h == "max" else ("le", a, b)
        return ("where", pick_a, da or const(0), db or const(0))
    raise TileError(f"internal: no derivative rule for {h}")
