"""Lowering a contraction Spec to a tiled kernel (C with OpenMP, or OpenCL C).

Steps: (1) `normalize` turns the output index expressions into plain output coordinates: each index is either
an output coordinate, derived from one (by an exact division or a mixed-radix split, with divisibility and
range conditions), or a reduction loop; every out-of-range read or constraint becomes an affine condition.
(2) `render` tiles the output: each thread / work-item owns a BM x BN register block over two output
dimensions and loops the reduction; every read and condition is computed once per the block coordinates it
depends on (scalar, row, column or element), so a conv reads each weight once per BN outputs and each input
once per BM outputs. Contractions shaped like a GEMM use the tuned GEMM templates (packed panels on C, local
memory tiles on OpenCL) instead.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from plait.codegen import gemm
from plait.codegen.cstyle import RenderedKernel
from plait.codegen.expr import ExprBuilder, Idx, strides_of
from plait.graph.node import Node
from plait.tile.spec import Aff, Spec, leaves

Cls = frozenset[str]
EMPTY: Cls = frozenset()


@dataclass
class Norm:
    """A contraction with plain output coordinates ("@d" pseudo-indices) and explicit conditions."""

    ranges: dict[str, tuple[int, int]]  # every index and "@d" output coordinate
    defs: dict[str, tuple[Any, ...]]  # derived index -> ("div", T, c, lo, hi) | ("radix", T, c, R, last)
    order: list[str]  # derived indices in definition order
    loops: list[tuple[str, int, int]]
    conds: list[tuple[str, Aff, int]]  # ("range", T, lo, hi) as ("ge", T, lo) / ("lt", T, hi), ("mod", T, c)


def _aff(terms: dict[str, int], c: int = 0) -> Aff:
    return Aff(tuple(sorted((v, k) for v, k in terms.items() if k)), c)


def normalize(spec: Spec) -> Norm:
    ranges = dict(spec.range_map)
    for d, s in enumerate(spec.out_shape):
        ranges[f"@{d}"] = (0, s)
    defs: dict[str, tuple[Any, ...]] = {}
    order: list[str] = []
    deps: dict[str, set[str]] = {}
    conds: list[tuple[str, Aff, int]] = []

    def add_range(t: Aff, lo: int | None, hi: int | None) -> None:
        a, b = t.interval({**ranges})
        if lo is not None and a < lo:
            conds.append(("ge", t, lo))
        if hi is not None and b >= hi:
            conds.append(("lt", t, hi))

    for d, e in enumerate(spec.out_idx):
        o = Aff(((f"@{d}", 1),))
        free = [v for v in e.vars if v not in defs and not any(v in deps[w] for w in defs)]
        radix = _radix(e, free, ranges)
        if radix is not None:
            digits = {v for v, _ in radix}
            fixed = _aff({v: c for v, c in e.terms if v not in digits})
            t = o - fixed - e.const
            add_range(t, 0, None)
            for k, (v, c) in enumerate(radix):
                last = k == len(radix) - 1
                lo, hi = ranges[v]
                defs[v] = ("radix", t, c, hi, last)
                deps[v] = set(t.vars)
                order.append(v)
                if k == 0 and c > 1:
                    conds.append(("mod", t, c))
                if last:
                    add_range(t, None, c * hi)
            continue
        if not free:
            t = o - e
            conds.append(("ge", t, 0))
            conds.append(("lt", t, 1))
            continue
        # the pivot: the free index with the largest range, so the loops left over are the short ones
        v = max(free, key=lambda w: (ranges[w][1] - ranges[w][0], -abs(e.coef(w)), w))
        c = e.coef(v)
        t = o - (e - Aff(((v, c),)))
        lo, hi = ranges[v]
        defs[v] = ("div", t, c, lo, hi)
        deps[v] = set(t.vars) | set().union(*(deps.get(w, set()) for w in t.vars))
        order.append(v)
        if abs(c) > 1:
            conds.append(("mod", t, abs(c)))
        if c > 0:
            add_range(t, c * lo, c * (hi - 1) + 1)
        else:
            add_range(t, c * (hi - 1), c * lo + 1)
    loops = [(v, lo, hi) for v, lo, hi in spec.ranges if v not in defs]
    for cst in spec.constraints:
        add_range(cst.expr, cst.lo, cst.hi)
    for lf in leaves(spec.expr):
        if lf[3] is None:
            for a, s in zip(lf[2], spec.shapes[lf[1]]):
                add_range(a, 0, s)
    loops.sort(
        key=lambda lp: (-_stride_weight(spec, lp[0]), spec.ranges.index(next(r for r in spec.ranges if r[0] == lp[0])))
    )
    return Norm(ranges, defs, order, loops, _dedup(conds))


def _dedup(conds: list[tuple[str, Aff, int]]) -> list[tuple[str, Aff, int]]:
    out: list[tuple[str, Aff, int]] = []
    for c in conds:
        if c not in out:
            out.append(c)
    return out


def _radix(e: Aff, free: list[str], ranges: dict[str, tuple[int, int]]) -> list[tuple[str, int]] | None:
    """Free indices of e that form a mixed-radix number (coefficients c, c*R1, c*R1*R2...), low digit first."""
    terms = sorted(((v, e.coef(v)) for v in free), key=lambda t: t[1])
    if len(terms) < 2 or terms[0][1] <= 0:
        return None
    for (v, c), (_, c2) in itertools.pairwise(terms):
        lo, hi = ranges[v]
        if lo != 0 or c2 != c * hi:
            return None
    if ranges[terms[-1][0]][0] != 0:
        return None
    return terms


def _stride_weight(spec: Spec, v: str) -> int:
    """The smallest memory step index v makes in any read (loops with large steps go outside)."""
    best = 0
    for lf in leaves(spec.expr):
        for a, st in zip(lf[2], strides_of(spec.shapes[lf[1]])):
            c = a.coef(v)
            if c:
                w = abs(c) * st
                best = w if best == 0 else min(best, w)
    return best


# ---------------------------------------------------------------- rendering


@dataclass
class Scope:
    cls: Cls
    lines: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    cache: dict[Any, str] = field(default_factory=dict)


class Renderer:
    def __init__(self, r: Any, spec: Spec, norm: Norm, out: Node, srcs: tuple[Node, ...], inputs: list[Node]):
        self.r, self.spec, self.norm, self.out, self.srcs = r, spec, norm, out, srcs
        self.params, names = r._params(out, inputs)
        self.idx_t = r.idx_type(out.size, *(n.size for n in inputs), *(n.size for n in srcs))
        self.b = ExprBuilder(r, names, self.idx_t)
        self.ct = r.compute_type(out.dtype)
        self.n = 0
        self._pick_block()
        self.scopes = {c: Scope(c) for c in (EMPTY, frozenset("i"), frozenset("j"), frozenset("ij"))}
        self.hoisted: dict[Any, str] = {}

    # -------------------------------------------------------- blocking

    def _pick_block(self) -> None:
        shape = self.out.shape
        rank = len(shape)
        self.dj = max((d for d in range(rank) if shape[d] > 1), default=rank - 1) if rank else None
        c = self.r.dialect == "c"
        self.bn = 1 if self.dj is None else min(16 if c else 4, 1 << (shape[self.dj] - 1).bit_length())
        cands = [d for d in range(rank) if d != self.dj and shape[d] > 1]
        self.di = None
        bm = 8 if c else 4
        if cands:
            deps = [self._closure(lf[2]) for lf in leaves(self.spec.expr)]
            jdep = [f"@{self.dj}" in dv for dv in deps]

            def loads(d: int) -> tuple[float, int]:
                # reads per reduction step per output element: a read that ignores the row dimension is
                # shared by the BM rows of the block, one that ignores the column dimension by its BN columns
                n = sum((bm if f"@{d}" in dv else 1) * (self.bn if j else 1) for dv, j in zip(deps, jdep))
                return (n / (bm * self.bn), -d)

            self.di = min(cands, key=loads)
        self.bm = 1 if self.di is None else min(bm, 1 << (shape[self.di] - 1).bit_length())

    def _closure(self, affs: Any) -> set[str]:
        out: set[str] = set()
        stack = [v for a in affs for v in a.vars]
        while stack:
            v = stack.pop()
            if v in out:
                continue
            out.add(v)
            if v in self.norm.defs:
                stack.extend(self.norm.defs[v][1].vars)
        return out

    def cls_of(self, affs: Any) -> Cls:
        vs = self._closure(affs)
        c = set()
        if self.di is not None and f"@{self.di}" in vs:
            c.add("i")
        if self.dj is not None and f"@{self.dj}" in vs:
            c.add("j")
        return frozenset(c)

    def expr_cls(self, e: tuple[Any, ...]) -> Cls:
        if e[0] == "acc":
            return self.cls_of(e[2])
        if e[0] == "const":
            return EMPTY
        return frozenset().union(*(self.expr_cls(x) for x in e[1:]))

    # -------------------------------------------------------- names of indices in a scope

    def tmp(self, sc: Scope, ctype: str, expr: str, prefix: str = "q") -> str:
        self.n += 1
        name = f"{prefix}{self.n}"
        sc.lines.append(f"{ctype} {name} = {expr};")
        return name

    def sym(self, sc: Scope, v: str) -> str:
        if v in self.scopes[EMPTY].names:
            return self.scopes[EMPTY].names[v]
        if v in sc.names:
            return sc.names[v]
        if v.startswith("@"):
            d = int(v[1:])
            slot = "bi" if d == self.di else "bj"
            hi = self.out.shape[d] - 1
            name = self.tmp(sc, self.idx_t, f"ob{d} + {slot} < {hi} ? ob{d} + {slot} : {hi}", f"o{d}_")
            sc.names[v] = name
            return name
        home = self.scopes[EMPTY] if self.cls_of((Aff(((v, 1),)),)) == EMPTY else sc
        kind, t, c, *rest = self.norm.defs[v]
        te = self.aff(home, t)
        lo, hi = (rest[0], rest[1]) if kind == "div" else (0, rest[0])
        raw = f"({te}) / {c}" if c != 1 else f"({te})"
        if kind == "radix" and not rest[1]:
            raw = f"(({te}) / {c}) % {rest[0]}"
        tlo, thi = t.interval(self.norm.ranges)
        if kind == "div" and c == 1 and lo <= tlo and thi < hi:
            home.names[v] = (
                te if len(t.terms) == 1 and t.terms[0][1] == 1 and not t.const else self.tmp(home, self.idx_t, te, "x")
            )
            return home.names[v]
        home.names[v] = self.tmp(home, self.idx_t, _clamp(raw, lo, hi - 1), "x")
        return home.names[v]

    def aff(self, sc: Scope, a: Aff) -> str:
        parts = []
        for v, c in a.terms:
            s = self.sym(sc, v)
            parts.append(s if c == 1 else f"{c} * {s}")
        if a.const or not parts:
            parts.append(str(a.const))
        return " + ".join(parts).replace("+ -", "- ")

    def cond(self, sc: Scope, c: tuple[str, Aff, int]) -> str:
        kind, t, k = c
        te = self.aff(sc, t)
        return {"ge": f"({te}) >= {k}", "lt": f"({te}) < {k}", "mod": f"({te}) % {k} == 0"}[kind]

    # -------------------------------------------------------- values

    def value(self, sc: Scope, e: tuple[Any, ...]) -> str:
        """A C expression for e in scope sc; parts that depend on fewer block coordinates are hoisted."""
        ec = self.expr_cls(e)
        if ec != sc.cls and e[0] != "const":
            return self.hoist(ec, e)
        h = e[0]
        if h == "const":
            return self.r.literal(e[1], self.out.dtype) if self.out.dtype.is_float else repr(e[1])
        if h == "acc":
            return self.read(sc, e)
        xs = [self.value(sc, x) for x in e[1:]]
        return self.tmp(sc, self.ct, _render_op(self.r, h, xs, self.ct))

    def hoist(self, ec: Cls, e: Any) -> str:
        key = (ec, e)
        if key in self.hoisted:
            return self.hoisted[key]
        sc = self.scopes[ec]
        is_cond = isinstance(e, tuple) and e[:1] == ("cond",)
        if is_cond:
            e = list(e[1:])
            v = " && ".join(f"({self.cond(sc, c)})" for c in e) if e else "1"
        else:
            v = self.value(sc, e)
        ctype = "int" if is_cond else self.ct
        if ec == EMPTY:
            name = v
        else:
            self.n += 1
            arr = f"h{self.n}"
            size = {"i": self.bm, "j": self.bn}.get("".join(sorted(ec)), 0)
            if size:
                self.scopes[EMPTY].lines.append(f"{ctype} {arr}[{size}];")
                sc.lines.append(f"{arr}[{'bi' if ec == frozenset('i') else 'bj'}] = {v};")
                name = f"{arr}[{'bi' if ec == frozenset('i') else 'bj'}]"
            else:
                name = v
        self.hoisted[key] = name
        return name

    def read(self, sc: Scope, lf: tuple[Any, ...]) -> str:
        _, p, idx, fill = lf
        src = self.srcs[p]
        shape = self.spec.shapes[p]
        coords, valid = [], []
        for a, s in zip(idx, shape):
            ce = self.aff(sc, a)
            lo, hi = a.interval(self.norm.ranges)
            if lo < 0 or hi >= s:
                if fill is not None:
                    valid.append(f"({ce}) >= 0 && ({ce}) < {s}")
                ce = _clamp(ce, 0, s - 1)
            coords.append(f"({ce})")
        self.b.lines, self.b.cache = sc.lines, sc.cache
        v = self.b.value(src, Idx(src.shape, coords=coords))
        if valid:
            lit = self.r.literal(fill, self.out.dtype) if self.out.dtype.is_float else str(int(fill))
            v = self.tmp(sc, self.ct, f"({' && '.join(valid)}) ? {v} : {lit}")
        return v

    # -------------------------------------------------------- the kernel

    def render(self) -> RenderedKernel:
        spec, out, r = self.spec, self.out, self.r
        shape = out.shape
        e0, si, sj, sij = (self.scopes[c] for c in (EMPTY, frozenset("i"), frozenset("j"), frozenset("ij")))
        # conditions, grouped by the block coordinates they depend on
        by_cls: dict[Cls, list[tuple[str, Aff, int]]] = {}
        for c in self.norm.conds:
            by_cls.setdefault(self.cls_of((c[1],)), []).append(c)
        for v, _, _ in self.norm.loops:
            e0.names[v] = _loopvar(v)
        dims = [d for d in range(len(shape)) if d not in (self.di, self.dj)]
        for d in dims:
            e0.names[f"@{d}"] = f"o{d}"
        for c in by_cls.get(EMPTY, []):
            e0.lines.append(f"if (!({self.cond(e0, c)})) continue;")
        val = self.value(sij, spec.expr)
        guards = [
            self.hoist(k, ("cond", *by_cls[k]))
            for k in (frozenset("i"), frozenset("j"), frozenset("ij"))
            if by_cls.get(k)
        ]
        acc = "acc[bi][bj]"
        new = _combine(spec.agg, acc, val)
        sij.lines.append(f"{acc} = ({' && '.join(guards)}) ? {new} : {acc};" if guards else f"{acc} = {new};")
        body = list(e0.lines)
        for sc, loops in ((si, ("bi",)), (sj, ("bj",)), (sij, ("bi", "bj"))):
            if sc.lines:
                body += _nest(loops, self.bm, self.bn, sc.lines)
        for v, lo, hi in reversed(self.norm.loops):
            body = [
                f"for ({self.idx_t} {_loopvar(v)} = {lo}; {_loopvar(v)} < {hi}; {_loopvar(v)}++) {{",
                *("  " + ln for ln in body),
                "}",
            ]
        # block decomposition: outer output dims, then row blocks, then column blocks
        head: list[str] = []
        rest = "blk"
        nbi = -(-shape[self.di] // self.bm) if self.di is not None else 1
        nbj = -(-shape[self.dj] // self.bn) if self.dj is not None else 1
        sizes: list[tuple[int | None, int, int]] = [(d, shape[d], 1) for d in dims] + [
            (self.di, nbi, self.bm),
            (self.dj, nbj, self.bn),
        ]
        inner = 1
        for bd, n, step in reversed(sizes):
            if bd is None:
                continue
            name = f"ob{bd}" if bd in (self.di, self.dj) else f"o{bd}"
            coord = rest if inner == 1 else f"({rest} / {inner})"
            head.append(f"{self.idx_t} {name} = ({coord} % {n}){f' * {step}' if step != 1 else ''};")
            inner *= n
        nblk = inner
        init = _identity(r, spec.agg, out.dtype)
        head.append(f"{self.ct} acc[{self.bm}][{self.bn}];")
        head += _nest(("bi", "bj"), self.bm, self.bn, [f"acc[bi][bj] = {init};"])
        st = strides_of(shape)
        lin = [f"o{d} * {st[d]}" for d in dims if shape[d] > 1]
        guard = []
        for bd, slot in ((self.di, "bi"), (self.dj, "bj")):
            if bd is not None:
                lin.append(f"(ob{bd} + {slot}) * {st[bd]}")
                if shape[bd] % (self.bm if slot == "bi" else self.bn):
                    guard.append(f"ob{bd} + {slot} < {shape[bd]}")
        res = _finalize(r, spec.agg, out.dtype, "acc[bi][bj]")
        store = r.store(out.dtype, "b0", " + ".join(lin) or "0", res)
        tail = _nest(("bi", "bj"), self.bm, self.bn, [f"if ({' && '.join(guard)}) {store}" if guard else store])
        lines = head + body + tail
        work = out.size * max(1, math.prod(hi - lo for _, lo, hi in self.norm.loops))
        body_lines, gs, ls = r.parallel_for("blk", nblk, lines, self.idx_t, work * 4)
        return r._finish("T", out, self.params, body_lines, gs, ls)  # type: ignore[no-any-return]


def _loopvar(v: str) -> str:
    return f"k_{v}"


def _nest(loops: tuple[str, ...], bm: int, bn: int, lines: list[str]) -> list[str]:
    body = list(lines)
    for lp in reversed(loops):
        n = bm if lp == "bi" else bn
        body = [f"for (int {lp} = 0; {lp} < {n}; {lp}++) {{", *("  " + ln for ln in body), "}"]
    return body


def _clamp(e: str, lo: int, hi: int) -> str:
    return f"(({e}) < {lo} ? {lo} : (({e}) > {hi} ? {hi} : ({e})))"


def _render_op(r: Any, h: str, xs: list[str], ct: str) -> str:
    a = xs[0]
    b = xs[1] if len(xs) > 1 else ""
    cmp = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
    if h in cmp:
        return f"({ct})(({a}) {cmp[h]} ({b}))"
    table = {
        "add": f"({a}) + ({b})",
        "sub": f"({a}) - ({b})",
        "mul": f"({a}) * ({b})",
        "div": f"({a}) / ({b})",
        "max": f"(({a}) > ({b}) ? ({a}) : ({b}))",
        "min": f"(({a}) < ({b}) ? ({a}) : ({b}))",
        "neg": f"-({a})",
        "exp": f"{r.fn('exp')}({a})",
        "log": f"{r.fn('log')}({a})",
        "sqrt": f"{r.fn('sqrt')}({a})",
        "abs": f"(({a}) < 0 ? -({a}) : ({a}))",
        "relu": f"(({a}) < 0 ? 0 : ({a}))",  # NaN passes through
        "tanh": f"{r.fn('tanh')}({a})",
        "sigmoid": f"1.0f / (1.0f + {r.fn('exp')}(-({a})))",
        "where": f"({a}) != 0 ? ({b}) : ({xs[2] if len(xs) > 2 else ''})",
    }
    return table[h]


def _combine(agg: str, acc: str, v: str) -> str:
    return {
        "sum": f"{acc} + {v}",
        "prod": f"{acc} * {v}",
        "max": f"({v} > {acc} ? {v} : {acc})",
        "min": f"({v} < {acc} ? {v} : {acc})",
        "assign": v,
    }[agg]


def _identity(r: Any, agg: str, dt: Any) -> str:
    if agg in ("sum", "assign"):
        return r.literal(0, dt)
    if agg == "prod":
        return r.literal(1, dt)
    if dt.is_float:
        return r.literal(-math.inf if agg == "max" else math.inf, dt)
    lim = 2**63 - 1 if dt.name == "int64" else 2**31 - 1
    return r.literal(-lim - 1 if agg == "max" else lim, dt)


def _finalize(r: Any, agg: str, dt: Any, acc: str) -> str:
    """An output element that received no term holds 0 for max and min (not an infinity)."""
    if agg in ("max", "min"):
        return f"({acc} == {_identity(r, agg, dt)} ? {r.literal(0, dt)} : {acc})"
    return acc


# ---------------------------------------------------------------- GEMM-shaped contractions


def gemm_spec(spec: Spec, srcs: tuple[Node, ...], inputs: list[Node]) -> gemm.GemmSpec | None:
    """A GemmSpec when spec is out[b.., i, j] += A[...] * B[...] over one index k with plain accesses."""
    e = spec.expr
    if spec.agg != "sum" or e[0] != "mul" or e[1][0] != "acc" or e[2][0] != "acc" or spec.constraints:
        return None
    if len(spec.out_shape) < 2 or any(len(a.terms) != 1 or a.terms[0][1] != 1 or a.const for a in spec.out_idx):
        return None
    ovars = [a.terms[0][0] for a in spec.out_idx]
    if len(set(ovars)) != len(ovars):
        return None
    red = [v for v, _, _ in spec.ranges if v not in ovars]
    if len(red) != 1:
        return None
    k = red[0]
    ranges = spec.range_map
    if ranges[k][0] != 0 or any(ranges[v] != (0, s) for v, s in zip(ovars, spec.out_shape)):
        return None
    ids = [n.uid for n in inputs]
    ops = []
    for lf in (e[1], e[2]):
        _, p, idx, fill = lf
        if fill is not None or srcs[p].dtype.name != "float32" or srcs[p].uid not in ids:
            return None
        if any(len(a.terms) != 1 or a.terms[0][1] != 1 or a.const for a in idx):
            return None
        vs = [a.terms[0][0] for a in idx]
        if len(set(vs)) != len(vs):
            return None
        shape = spec.shapes[p]
        st = dict(zip(vs, strides_of(shape)))
        if any(ranges[v] != (0, s) for v, s in zip(vs, shape)):
            return None
        ops.append((p, st))
    (pa, sa), (pb, sb) = ops
    i, j = ovars[-2], ovars[-1]
    if j in sa or i in sb:
        (pa, sa), (pb, sb) = (pb, sb), (pa, sa)
    if j in sa or i in sb or k not in sa or k not in sb or [srcs[pa].uid, srcs[pb].uid] != ids:
        return None
    batch = ovars[:-2]
    bst = []
    for st in (sa, sb):
        dims = [(s, st.get(v, 0)) for v, s in zip(batch, spec.out_shape) if s != 1]
        for (_, s0), (d1, s1) in itertools.pairwise(dims):
            if s0 != d1 * s1:
                return None
        bst.append(dims[-1][1] if dims else 0)
    m, n = spec.out_shape[-2], spec.out_shape[-1]
    bsz = math.prod(spec.out_shape[:-2])
    return gemm.GemmSpec(bsz, m, n, ranges[k][1], (0, bst[0], sa.get(i, 0), sa[k]), (0, bst[1], sb[k], sb.get(j, 0)))


def render_kernel(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
    """The OpDef.kernel of every tile node."""
    spec: Spec = out.arg
    gs = gemm_spec(spec, out.srcs, inputs) if out.dtype.name == "float32" else None
    if gs is not None and gs.m > 1:
        if r.dialect == "c":
            return gemm.render_c(gs)
        small = {"TSM": 32, "TSN": 32, "TSK": 16, "WPTM": 2, "WPTN": 2} if gs.m * gs.n < 64 * 64 * 32 else None
        return gemm.render_opencl(gs, small)
    return Renderer(r, spec, normalize(spec), out, out.srcs, inputs).render()
