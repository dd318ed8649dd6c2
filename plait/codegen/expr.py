"""Index arithmetic and expression emission shared by every C-style dialect.

`ExprBuilder.value(node, idx)` returns a C expression for element `idx` of `node`, emitting temporaries into
`lines`. Movement ops become index transforms; pad and cat clamp their source indices so every load stays in
bounds and select the fill value afterwards. Values are cached per (node, index) for common subexpressions.
"""

from __future__ import annotations

import math
from typing import Any

from plait.errors import UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OPS


def strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def coord_exprs(lin: str, shape: tuple[int, ...]) -> list[str]:
    """The per-axis coordinates of row-major index `lin` in `shape` as C expressions: "0" on axes of size 1, the first
    other axis without a modulo. Kept as expressions (not temporaries), adjacent (X / d) and (X % d) fold back to X
    in ExprBuilder.linear."""
    out: list[str] = []
    for s, t in zip(shape, strides_of(shape), strict=True):
        e = lin if t == 1 else f"({lin} / {t})"
        out.append("0" if s == 1 else f"({e} % {s})" if any(c != "0" for c in out) else e)
    return out


class Idx:
    """An element position in `shape`: a linear (row-major) index, per-axis coordinates, or both."""

    def __init__(self, shape: tuple[int, ...], linear: str | None = None, coords: list[str] | None = None):
        self.shape = shape
        self.linear = linear
        self.coords = coords

    def key(self) -> Any:
        return ("L", self.linear) if self.linear is not None else ("C", tuple(self.coords or ()))


class ExprBuilder:
    def __init__(self, renderer: Any, args: dict[int, str], idx_t: str, subst: dict[int, str] | None = None):
        self.r = renderer
        self.args = args  # node uid -> buffer argument name
        self.subst = subst or {}  # node uid -> a variable already holding its value at the current index
        self.idx_t = idx_t
        self.lines: list[str] = []
        self.cache: dict[Any, str] = {}
        self.n = 0
        self.cat_parts = 0  # sources of the cats rendered so far: each is a branch a vectorised loop would evaluate
        # (width, inner, a, j) when a row loop splits the root's last axis (cstyle._row_split): its coordinate is
        # "(a * inner + j)", and a reshape that splits that axis takes its parts from a and j apart
        self.row_split: tuple[int, int, str, str] | None = None

    def tmp(self, ctype: str, expr: str, prefix: str = "t") -> str:
        self.n += 1
        name = f"{prefix}{self.n}"
        self.lines.append(f"{ctype} {name} = {expr};")
        return name

    # ---------------------------------------------------------------- indices

    def coords(self, idx: Idx) -> list[str]:
        if idx.coords is None:
            assert idx.linear is not None
            idx.coords = [c if c == "0" else self.tmp(self.idx_t, c, "i") for c in coord_exprs(idx.linear, idx.shape)]
        return idx.coords

    def linear(self, idx: Idx) -> str:
        if idx.linear is None:
            cs, st = list(self.coords(idx)), strides_of(idx.shape)
            # adjacent coordinates (X / d) and (X % d) with strides d * t and t are X * t: C's identity, which gcc does
            # not apply (a GEMM epilogue's residual read at ((j / 56) * 56 + j % 56) became a gather per 16 values)
            for a in range(len(cs) - 1):
                x, slash, d = cs[a].removeprefix("(").removesuffix(")").rpartition(" / ")
                if slash and d.isdigit() and cs[a + 1] == f"({x} % {d})" and st[a] == int(d) * st[a + 1]:
                    cs[a], cs[a + 1] = "0", x
            terms = [
                f"{c} * {t}" if t != 1 else c for c, t, s in zip(cs, st, idx.shape, strict=True) if s != 1 and c != "0"
            ]
            idx.linear = self.tmp(self.idx_t, " + ".join(terms) if terms else "0", "i")
        return idx.linear

    def _reshape_idx(self, idx: Idx, src_shape: tuple[int, ...]) -> Idx:
        split = self._split_reshape(idx, src_shape)
        if split is not None:
            return split
        if idx.linear is not None:
            return Idx(src_shape, linear=idx.linear)
        a = [(c, s) for c, s in zip(self.coords(idx), idx.shape, strict=True) if s != 1]
        if [s for _, s in a] == [s for s in src_shape if s != 1]:
            it = iter(c for c, _ in a)
            return Idx(src_shape, coords=[next(it) if s != 1 else "0" for s in src_shape])
        return Idx(src_shape, linear=self.linear(idx))

    def _split_reshape(self, idx: Idx, src_shape: tuple[int, ...]) -> Idx | None:
        """The source coordinates of a reshape that keeps idx's leading axes and splits its last one, where that axis
        is the row loop's split coordinate (a * inner + j, self.row_split) and `inner` is a product of the split's
        trailing parts: those parts' coordinates from j, the others' from a. None otherwise."""
        if self.row_split is None or idx.coords is None:
            return None
        w, inner, a, j = self.row_split
        if idx.shape[-1] != w or idx.coords[-1] != f"({a} * {inner} + {j})":
            return None
        lead = [(c, s) for c, s in zip(idx.coords[:-1], idx.shape[:-1], strict=True) if s != 1]
        axes = [i for i, s in enumerate(src_shape) if s != 1]
        if [src_shape[i] for i in axes[: len(lead)]] != [s for _, s in lead]:
            return None
        rest = axes[len(lead) :]
        tail, prod = len(rest), 1
        while tail > 0 and prod < inner:
            tail -= 1
            prod *= src_shape[rest[tail]]
        if prod != inner or tail == 0 or math.prod(src_shape[i] for i in rest) != w:
            return None
        coords = ["0"] * len(src_shape)
        for (c, _), i in zip(lead, axes, strict=False):
            coords[i] = c
        outer = self.coords(Idx(tuple(src_shape[i] for i in rest[:tail]), linear=a))
        # the inner parts as expressions of j, not temporaries, so that linear() folds (j / d) * d + j % d back to j
        inside = coord_exprs(j, tuple(src_shape[i] for i in rest[tail:]))
        for i, c in zip(rest, [*outer, *inside], strict=True):
            coords[i] = c
        return Idx(src_shape, coords=coords)

    def _clamp(self, e: str, hi: int) -> str:
        return f"(({e}) < 0 ? 0 : (({e}) > {hi} ? {hi} : ({e})))"

    # ---------------------------------------------------------------- values

    def value(self, node: Node, idx: Idx) -> str:
        key = (node.uid, idx.key())
        if key in self.cache:
            return self.cache[key]
        v = self._value(node, idx)
        self.cache[key] = v
        return v

    def load(self, node: Node, idx: Idx) -> str:
        off = self.linear(idx) if node.size > 1 else "0"
        return self.tmp(self.r.compute_type(node.dtype), self.r.load(node.dtype, self.args[node.uid], off), "v")

    def _value(self, node: Node, idx: Idx) -> str:
        if node.uid in self.subst:
            return self.subst[node.uid]
        if node.uid in self.args:
            return self.load(node, idx)
        op = node.op
        if op == "const":
            return self.r.literal(node.arg, node.dtype)
        kind = OPS[op].kind
        if kind == "movement":
            return self._movement(node, idx)
        if kind != "elementwise":
            raise UnsupportedError(f"internal: {op} {node.shape} must be realized before an elementwise kernel")
        vals = [self.value(s, idx) for s in node.srcs]
        if op == "cast":
            expr = self.r.cast(vals[0], node.srcs[0].dtype, node.dtype)
        else:
            render = OPS[op].render
            assert render is not None
            in_dt = node.srcs[-1].dtype
            expr = render(self.r, in_dt, *vals)
        return self.tmp(self.r.compute_type(node.dtype), expr)

    def _movement(self, node: Node, idx: Idx) -> str:
        op, src = node.op, node.srcs[0]
        if op == "reshape":
            return self.value(src, self._reshape_idx(idx, src.shape))
        cs = self.coords(idx)
        if op == "permute":
            new = [""] * len(cs)
            for i, p in enumerate(node.arg):
                new[p] = cs[i]
            return self.value(src, Idx(src.shape, coords=new))
        if op == "expand":
            new = ["0" if s == 1 else c for c, s in zip(cs, src.shape, strict=True)]
            return self.value(src, Idx(src.shape, coords=new))
        if op == "shrink":
            new = [
                c if (a, t) == (0, 1) else f"({a} + {c} * {t})" if t != 1 else f"({a} + {c})"
                for c, (a, _, t) in zip(cs, node.arg, strict=True)
            ]
            return self.value(src, Idx(src.shape, coords=new))
        if op == "flip":
            new = [f"({src.shape[i] - 1} - {c})" if i in node.arg else c for i, c in enumerate(cs)]
            return self.value(src, Idx(src.shape, coords=new))
        if op == "pad":
            return self._pad(node, cs)
        if op == "cat":
            return self._cat(node, cs)
        raise UnsupportedError(f"internal: unknown movement op {op}")

    def _pad(self, node: Node, cs: list[str]) -> str:
        pads, fill = node.arg
        src = node.srcs[0]
        conds: list[str] = []
        new: list[str] = []
        for c, (before, _), s in zip(cs, pads, src.shape, strict=True):
            if before == 0 and s == node.shape[len(new)]:
                new.append(c)
                continue
            shifted = f"({c} - {before})" if before else c
            conds.append(f"({shifted} >= 0 && {shifted} < {s})")
            new.append(self.tmp(self.idx_t, self._clamp(shifted, s - 1), "i"))
        v = self.value(src, Idx(src.shape, coords=new))
        if not conds:
            return v
        return self.tmp(
            self.r.compute_type(node.dtype), f"({' && '.join(conds)}) ? {v} : {self.r.literal(fill, node.dtype)}"
        )

    def _cat(self, node: Node, cs: list[str]) -> str:
        """Only the source that holds the element is evaluated, found by a balanced tree of if/else branches on the
        cat axis (log2 of the source count comparisons: an unrolled RNN's gradient joins hundreds of time steps)."""
        axis, c = node.arg, cs[node.arg]
        starts = [0]
        for src in node.srcs:
            starts.append(starts[-1] + src.shape[axis])
        if c.isdigit():  # a constant position (an unrolled reduction over a stack): the source is known here
            part = next(i for i in range(len(node.srcs)) if int(c) < starts[i + 1])
            new = list(cs)
            new[axis] = str(int(c) - starts[part])
            return self.value(node.srcs[part], Idx(node.srcs[part].shape, coords=new))
        self.n += 1
        out = f"t{self.n}"
        self.lines.append(f"{self.r.compute_type(node.dtype)} {out};")
        self.cat_parts += len(node.srcs)

        def emit(lo: int, hi: int) -> None:
            if hi - lo == 1:
                src = node.srcs[lo]
                new = list(cs)
                new[axis] = f"({c} - {starts[lo]})" if starts[lo] else c
                saved = dict(self.cache)
                self.lines.append(f"{out} = {self.value(src, Idx(src.shape, coords=new))};")
                self.cache = saved  # values computed inside a branch are not visible after it
                return
            mid = (lo + hi) // 2
            self.lines.append(f"if ({c} < {starts[mid]}) {{")
            emit(lo, mid)
            self.lines.append("} else {")
            emit(mid, hi)
            self.lines.append("}")

        emit(0, len(node.srcs))
        return out
