"""The C-style renderer base: kernels for elementwise and reduce groups, rendered to source text.

Dialects (c.py, opencl.py) override a handful of attributes and hooks: how a kernel is declared, how a
parallel loop is spelled, type names, half-precision loads and stores, and a few math function names.
"""

from __future__ import annotations

import math
from typing import Any

from plait import dtypes
from plait.codegen.expr import ExprBuilder, Idx, coord_exprs
from plait.dtypes import DType
from plait.graph.node import Node


class RenderedKernel:
    """Source text plus what the runtime needs to launch it."""

    def __init__(
        self,
        name: str,
        source: str,
        global_size: tuple[int, ...],
        local_size: tuple[int, ...] | None,
        writes: int = 1,
    ):
        self.name = name
        self.source = source
        self.global_size = global_size
        self.local_size = local_size
        self.writes = writes  # how many leading buffer arguments the kernel writes (the output first)


_IDENTITY = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf}
MAX_SIMD_CAT_PARTS = 8  # an elementwise kernel whose cats join more sources than this loops without `simd`
UNROLL_REDUCE = 16  # reductions over at most this many elements are written out term by term
# a group-split sum over a stack of at most this many members (batch norm's two moments, its two backward sums)
# sums every member in one work-group, so the activation or gradient they share is read once
MAX_STACK_MEMBERS = 4
ROW_MIN_WIDTH = 8  # row loops need rows at least this long (shorter ones loop flat: a vector would sit half idle)
ROW_MIN_COUNT = 4  # ... and at least this many rows to share among threads


def _value_at_r(
    b: ExprBuilder,
    src: Node,
    ocs: list[str],
    axes: tuple[int, ...],
    red: tuple[int, ...],
    linear: str | None = None,
) -> tuple[str, list[str]]:
    """`src` at output coordinates `ocs` with the reduced axes at linear position `r`: the value's expression and
    the statements computing it, kept apart from b's lines (they go inside the reduction loop). `linear`, where
    given, is the same position as src's linear index."""
    vs, inner = _values_at_r(b, src, [ocs], axes, red, linear)
    return vs[0], inner


def _values_at_r(
    b: ExprBuilder,
    src: Node,
    ocss: list[list[str]],
    axes: tuple[int, ...],
    red: tuple[int, ...],
    linear: str | None = None,
) -> tuple[list[str], list[str]]:
    """`_value_at_r` at several output coordinates in one loop body: loads the values share (the same buffer at
    the same position) are made once."""
    saved_lines, saved_cache = b.lines, dict(b.cache)
    inner: list[str] = []
    b.lines = inner
    rcs = b.coords(Idx(red, linear="r")) if len(red) > 1 else ["r"]
    vs = []
    for ocs in ocss:
        full = list(ocs)
        for a, c in zip(axes, rcs, strict=True):
            full[a] = c
        vs.append(b.value(src, Idx(src.shape, linear=linear, coords=full)))
    b.lines, b.cache = saved_lines, saved_cache
    return vs, inner


def _stacked_members(src: Node, buffers: dict[int, str]) -> int:
    """How many members a reduction over `src` that keeps axis 0 can sum in one loop: src.shape[0] (2 to
    MAX_STACK_MEMBERS) where src's fused expression stacks its members along axis 0 (batch norm's moments and
    backward sums: each member reads the same activation or gradient), else 1."""
    if len(src.shape) < 2 or not 1 < src.shape[0] <= MAX_STACK_MEMBERS:
        return 1
    todo, seen = [src], set()
    while todo:
        n = todo.pop()
        if n.uid in seen or n.uid in buffers:
            continue
        seen.add(n.uid)
        if n.op == "cat" and n.arg == 0 and n.shape[0] == src.shape[0]:
            return src.shape[0]
        todo.extend(n.srcs)
    return 1


class CStyleRenderer:
    dialect = "cstyle"
    storage_types = {"float32": "float", "float16": "half", "int32": "int", "int64": "long", "bool": "unsigned char"}
    fn_names: dict[str, str] = {}
    interleaved_split = False  # partial reductions: contiguous chunks (CPU caches) or strided (GPU coalescing)
    preamble = ""
    # loop outputs as rows (an inner loop over the last axis): indices are then affine in the inner variable, so a
    # pooling window's strided views load as vectors instead of gathers with per-element divisions
    row_loops = False
    helper_qualifier = "static inline"  # how a helper function in a kernel's source is declared
    # work-group and work-item-in-group ids, local memory and its barrier: dialects that set them render partial
    # reductions one work-group per partial (`_render_group_reduce`)
    group_ids: tuple[str, str] | None = None
    local_prefix = ""
    barrier = ""
    # integer power by squaring in unsigned arithmetic (wraps like NumPy instead of signed-overflow UB); a negative
    # exponent truncates 1/a**-b toward zero
    ipow_helper = (
        "{q} long plait_ipow(long a, long b) {{ if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;"
        " unsigned long r = 1, x = (unsigned long)a; while (b) {{ if (b & 1) r *= x; x *= x; b >>= 1; }}"
        " return (long)r; }}\n"
    )

    # ---------------------------------------------------------------- types and values

    def storage_type(self, dt: DType) -> str:
        return self.storage_types[dt.name]

    def compute_type(self, dt: DType) -> str:
        return {"float16": "float", "bool": "int"}.get(dt.name, self.storage_types[dt.name])

    def fn(self, name: str) -> str:
        return self.fn_names.get(name, name)

    def literal(self, v: Any, dt: DType) -> str:
        if dt.is_float:
            v = float(v)
            if math.isnan(v):
                return "NAN"
            if math.isinf(v):
                return "INFINITY" if v > 0 else "(-INFINITY)"
            return f"{v!r}f" if "e" in repr(v) or "." in repr(v) else f"{v!r}.0f"
        if dt == dtypes.bool_:
            return "1" if v else "0"
        v = int(v)
        if dt == dtypes.int64:
            return f"{v}L" if v > -(2**63) else f"({v + 1}L - 1L)"
        return str(v) if v > -(2**31) else f"({v + 1} - 1)"

    def load(self, dt: DType, buf: str, off: str) -> str:
        return f"{buf}[{off}]" if dt != dtypes.bool_ else f"(int){buf}[{off}]"

    def store(self, dt: DType, buf: str, off: str, val: str) -> str:
        if dt == dtypes.bool_:
            return f"{buf}[{off}] = ({val}) != 0;"
        return f"{buf}[{off}] = {val};"

    def round_half(self, v: str) -> str:
        raise NotImplementedError

    def cast(self, v: str, src: DType, dst: DType) -> str:
        if dst == dtypes.bool_:
            return f"(({v}) != 0)"
        if dst == dtypes.float16:
            return self.round_half(f"(float)({v})")
        return f"({self.compute_type(dst)})({v})"

    # ---------------------------------------------------------------- skeleton hooks (dialects override)

    def param(self, dt: DType, name: str, is_output: bool) -> str:
        raise NotImplementedError

    def declare(self, name: str, params: list[str]) -> str:
        raise NotImplementedError

    def function(self, name: str, params: list[str], body: str) -> str:
        """The source of kernel `name` around its `body` (dialects with more than one entry point add them)."""
        return f"{self.declare(name, params)} {{\n{body}\n}}\n"

    def parallel_for(
        self, var: str, n: int, body: list[str], idx_t: str, work: int, simd_ok: bool = False
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        """Loop `var` over n outputs in parallel; simd_ok says iterations are independent (elementwise)."""
        raise NotImplementedError

    def parallel_rows(
        self, rows: int, width: int, head: list[str], body: list[str], idx_t: str, work: int, simd_ok: bool
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        """Loop `o` over `rows` in parallel, running `head` once per row and `body` for each `j` < `width` with
        `gid` = o * width + j (only dialects with `row_loops` set are asked)."""
        raise NotImplementedError

    def reduce_loop(
        self,
        var: str,
        lo: str,
        hi: str,
        step: str,
        body: list[str],
        idx_t: str,
        acc: str,
        op: str,
        nan_flag: bool = False,
    ) -> list[str]:
        """A sequential loop accumulating into `acc` with `op`; `nan_flag`: the body also or's into int `nanf`."""
        return [f"for ({idx_t} {var} = {lo}; {var} < {hi}; {var} += {step}) {{", *body, "}"]

    # ---------------------------------------------------------------- kernels

    def _params(self, out: Node, inputs: list[Node]) -> tuple[list[str], dict[int, str]]:
        params = [self.param(out.dtype, "b0", True)]
        names: dict[int, str] = {}
        for i, node in enumerate(inputs, 1):
            params.append(self.param(node.dtype, f"b{i}", False))
            names[node.uid] = f"b{i}"
        return params, names

    def _finish(
        self, kind: str, out: Node, params: list[str], lines: list[str], gs: tuple[int, ...], ls: tuple[int, ...] | None
    ) -> RenderedKernel:
        import hashlib

        body = "\n".join("  " + ln for ln in lines)
        digest = hashlib.sha256(("\n".join(params) + body).encode()).hexdigest()[:10]
        name = f"{kind}_{'x'.join(map(str, out.shape)) or 's'}_{digest}"
        helpers = self.ipow_helper.format(q=self.helper_qualifier) if "plait_ipow(" in body else ""
        src = f"{self.preamble}{helpers}{self.function(name, params, body)}"
        return RenderedKernel(name, src, gs, ls)

    def idx_type(self, *sizes: int) -> str:
        return "int" if max(sizes, default=1) < 2**31 - 1 else "long"

    def render_elementwise(self, out: Node, root: Node, inputs: list[Node]) -> RenderedKernel:
        params, names = self._params(out, inputs)
        idx_t = self.idx_type(out.size, *(n.size for n in inputs))
        b = ExprBuilder(self, names, idx_t)
        shape = root.shape
        split = self._row_split(root, set(names))
        if split:  # the row axis looped as (a, j): rows of its `split` innermost positions (see _row_split)
            shape = (*shape[:-1], shape[-1] // split, split)
        head, cs = self._row_coords(b, shape)
        if cs and split:
            b.row_split = (root.shape[-1], split, cs[-2], cs[-1])
            cs = [*cs[:-2], f"({cs[-2]} * {split} + {cs[-1]})"]
        v = b.value(root, Idx(root.shape, linear="gid", coords=cs) if cs else Idx(root.shape, linear="gid"))
        b.lines.append(self.store(out.dtype, "b0", "gid", v))
        # A vectorised loop evaluates every branch under a mask: with many cat sources (an unrolled RNN's gradient
        # joins hundreds) scalar branches are an order of magnitude faster.
        simd_ok = b.cat_parts <= MAX_SIMD_CAT_PARTS
        lines, gs, ls = self._loop(b, head, shape, out.size, idx_t, out.size * max(1, len(b.lines)), simd_ok)
        return self._finish("E", out, params, lines, gs, ls)

    def _row_split(self, root: Node, leaves: set[int]) -> int:
        """Where an operand reads the root's last axis through a reshape that splits it (a channel-major view
        (C, N*H*W) of an NCHW tensor: N, H, W), the innermost positions its trailing parts cover, common to every
        such reshape (H*W): the row loop then runs over those, one row per leading position, so that each operand's
        row is a contiguous run. Without it each element's source position was divided out of the flat index and
        loaded by a gather (a training step's batch-norm gradients ran at 3-4 GB/s). 0: no split."""
        if not self.row_loops or len(root.shape) < 1 or root.shape[-1] < 2 * ROW_MIN_WIDTH:
            return 0
        w = root.shape[-1]
        found: list[int] = []
        seen: set[int] = set()
        stack = [root]
        while stack:
            n = stack.pop()
            if n.uid in seen or n.uid in leaves:
                continue
            seen.add(n.uid)
            if n.op == "reshape" and n.shape == root.shape:
                src, lead = n.srcs[0].shape, [d for d in root.shape[:-1] if d != 1]
                dims = [d for d in src if d != 1]
                if dims[: len(lead)] == lead and math.prod(dims[len(lead) :]) == w and len(dims) - len(lead) >= 2:
                    found.append(w // dims[len(lead)])
            stack.extend(n.srcs)
        if not found:
            return 0
        b = math.gcd(*found)
        return b if ROW_MIN_WIDTH <= b < w and self._row_width((*root.shape[:-1], w // b, b)) else 0

    def render_elementwise_group(self, out: Node, writes: list[Node], inputs: list[Node]) -> RenderedKernel:
        """One kernel computing several elementwise outputs of out's size at each index: `out` (b0) and `writes`,
        which lead `inputs` as buffers it fills (scheduler._merge_final_writes: one launch instead of one each)."""
        params, names = self._params(out, inputs)
        for i, w in enumerate(writes, 1):
            params[i] = self.param(w.dtype, f"b{i}", True)
        idx_t = self.idx_type(out.size, *(n.size for n in inputs))
        b = ExprBuilder(self, {k: v for k, v in names.items() if k not in {w.uid for w in writes}}, idx_t)
        for name, node in [("b0", out), *((names[w.uid], w) for w in writes)]:
            v = b.value(node, Idx(node.shape, linear="gid"))
            b.lines.append(self.store(node.dtype, name, "gid", v))
        lines, gs, ls = self.parallel_for("gid", out.size, b.lines, idx_t, out.size * max(1, len(b.lines)))
        k = self._finish("E", out, params, lines, gs, ls)
        k.writes = 1 + len(writes)
        return k

    def _row_width(self, shape: tuple[int, ...]) -> tuple[int, int] | None:
        """(axis, width) of the row loop over `shape`'s last axis longer than 1, with the axes before it merged in
        while the row is shorter than ROW_MIN_WIDTH (a 7x7 plane: rows of 49), when the dialect loops rows, the rows
        are long enough to vectorise and there are enough of them to share among threads; else None."""
        axes = [a for a, d in enumerate(shape) if d != 1]
        if not self.row_loops or not axes:
            return None
        k, width = len(axes) - 1, shape[axes[-1]]
        while width < ROW_MIN_WIDTH and k > 0:
            k -= 1
            width *= shape[axes[k]]
        if width < ROW_MIN_WIDTH or math.prod(shape) // width < ROW_MIN_COUNT:
            return None
        return axes[k], width

    def _row_coords(self, b: ExprBuilder, shape: tuple[int, ...]) -> tuple[list[str], list[str] | None]:
        """For a row loop over `shape`: the lines that place row `o` (run once per row) and the coordinates of
        element (o, j); b.lines is left empty for the per-element body. ([], None) when rows are not looped."""
        row = self._row_width(shape)
        if row is None:
            return [], None
        ax, _ = row
        outer = b.coords(Idx(shape[:ax], linear="o")) if ax else []
        head, b.lines = b.lines, []
        # the row's axes from j as expressions, so that an operand laid out like the row reads at j
        return head, [*outer, *coord_exprs("j", shape[ax:])]

    def _loop(
        self, b: ExprBuilder, head: list[str], shape: tuple[int, ...], n: int, idx_t: str, work: int, simd_ok: bool
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        """The parallel loop around b.lines over the n outputs of `shape`: rows when `_row_coords` set them up."""
        row = self._row_width(shape)
        if row is None:
            return self.parallel_for("gid", n, b.lines, idx_t, work, simd_ok)
        width = row[1]
        body = [f"{idx_t} gid = o * {width} + j;", *b.lines]
        return self.parallel_rows(n // width, width, head, body, idx_t, work, simd_ok)

    def render_reduce(self, out: Node, root: Node, inputs: list[Node]) -> RenderedKernel:
        """A reduce (rsum/rmax/rmin/rprod/argmax/argmin) or a partial reduce (rsplit) writing `out`."""
        params, names = self._params(out, inputs)
        split = 1
        if root.op == "rsplit":
            op, axes, split, group = root.arg
            if group > 1:
                return self._render_group_reduce(out, root, params, names, group)
        elif root.op in ("argmax", "argmin"):
            op, axes = root.op, root.arg
        else:
            op, axes = root.op[1:], root.arg
        src = root.srcs[0]
        keep = tuple(1 if i in axes else s for i, s in enumerate(src.shape))
        red = tuple(src.shape[a] for a in axes)
        total = math.prod(red)
        idx_t = self.idx_type(out.size, src.size, *(n.size for n in inputs))
        b = ExprBuilder(self, names, idx_t)
        if split == 1 and op not in ("argmax", "argmin") and total <= UNROLL_REDUCE:
            return self._render_unrolled_reduce(b, out, src, op, axes, keep, params)
        lines = b.lines
        if split > 1:
            o = b.tmp(idx_t, f"gid / {split}", "o")
            p = b.tmp(idx_t, f"gid % {split}", "p")
        else:
            o, p = "gid", "0"
        ocs = b.coords(Idx(keep, linear=o))
        ct = self.compute_type(src.dtype)
        is_arg = op in ("argmax", "argmin")
        # NaN propagates through float max/min as in NumPy: a flag or'ed over the loop (a vectorised max drops NaN)
        nan_flag = src.dtype.is_float and op in ("max", "min")
        lines.append(f"{ct} acc = {self.literal(_reduce_init(op, src.dtype), src.dtype)};")
        if is_arg:
            lines.append("long acci = 0;")
        if nan_flag:
            lines.append("int nanf = 0;")
        if split > 1:
            chunk = -(-total // split)
            lo, hi, step = (
                (p, str(total), str(split))
                if self.interleaved_split
                else (f"{p} * {chunk}", f"({p} * {chunk} + {chunk} < {total} ? {p} * {chunk} + {chunk} : {total})", "1")
            )
        else:
            lo, hi, step = "0", str(total), "1"
        if axes == tuple(range(len(src.shape) - len(axes), len(src.shape))):
            # the reduced axes are the innermost: position r of output o is element o * total + r of src, one
            # linear index (not r split into the axes' coordinates and put back together, which kept a contiguous
            # mean over a 7x7 plane from vectorizing: 4.5x slower)
            v, inner = _value_at_r(b, src, ocs, axes, red, f"({o} * {total} + r)")
        else:
            v, inner = _value_at_r(b, src, ocs, axes, red)
        if is_arg:
            cmp = ">" if op == "argmax" else "<"
            # the first NaN wins, like NumPy (once acc is NaN no comparison succeeds)
            nan = f" || ({v} != {v} && acc == acc)" if src.dtype.is_float else ""
            inner.append(f"if ({v} {cmp} acc{nan}) {{ acc = {v}; acci = r; }}")
        else:
            inner.append("acc = " + _combine(op, "acc", v) + ";")
        if nan_flag:
            inner.append(f"nanf |= {v} != {v};")
        lines.extend(self.reduce_loop("r", lo, hi, step, inner, idx_t, "acc", "" if is_arg else op, nan_flag))
        if nan_flag:
            lines.append("if (nanf) acc = NAN;")
        lines.append(self.store(out.dtype, "b0", "gid", "acci" if is_arg else "acc"))
        body, gs, ls = self.parallel_for("gid", out.size, lines, idx_t, out.size * max(1, total // split))
        return self._finish("R", out, params, body, gs, ls)

    def _render_group_reduce(
        self, out: Node, root: Node, params: list[str], names: dict[int, str], group: int
    ) -> RenderedKernel:
        """A partial reduction (rsplit) whose every partial is a work-group of `group` work-items: work-group w sums
        positions (w % parts) * group + lid, stepping parts * group, so a warp reads consecutive positions of the
        reduced axes (coalesced where they are the innermost), then the group combines its sums as a tree in local
        memory. A sum over a stack along axis 0 (`_stacked_members`) sums all members in each work-group, one
        accumulator each, writing member m's partial at m * (out.size / members) + w. Only dialects with
        work-groups and local memory (`group_ids`) render it."""
        if self.group_ids is None:
            raise NotImplementedError(f"{self.dialect} has no work-groups for a group-split reduction")
        op, axes, parts = root.arg[:3]
        src = root.srcs[0]
        keep = tuple(1 if i in axes else s for i, s in enumerate(src.shape))
        red = tuple(src.shape[a] for a in axes)
        total = math.prod(red)
        members = _stacked_members(src, names) if op == "sum" and 0 not in axes else 1
        idx_t = self.idx_type(out.size * group, src.size, *(n.size for n in root.srcs))
        b = ExprBuilder(self, names, idx_t)
        grp, lid = self.group_ids
        w = b.tmp(idx_t, grp, "w")
        li = b.tmp(idx_t, lid, "l")
        o = b.tmp(idx_t, f"{w} / {parts}", "o")
        ocs = b.coords(Idx((1, *keep[1:]) if members > 1 else keep, linear=o))
        ct = self.compute_type(src.dtype)
        lines = b.lines
        accs = [f"acc{m}" for m in range(members)] if members > 1 else ["acc"]
        lines += [f"{ct} {a} = {self.literal(_reduce_init(op, src.dtype), src.dtype)};" for a in accs]
        nan_flag = src.dtype.is_float and op in ("max", "min")
        if nan_flag:
            lines.append("int nanf = 0;")
        ocss = [[str(m), *ocs[1:]] for m in range(members)] if members > 1 else [ocs]
        vs, inner = _values_at_r(b, src, ocss, axes, red)
        inner += [f"{a} = {_combine(op, a, v)};" for a, v in zip(accs, vs, strict=True)]
        if nan_flag:
            inner.append(f"nanf |= {vs[0]} != {vs[0]};")
        lo, step = f"({w} % {parts}) * {group} + {li}", str(parts * group)
        lines.extend(self.reduce_loop("r", lo, str(total), step, inner, idx_t, "acc", op, nan_flag))
        if nan_flag:
            lines.append("if (nanf) acc = NAN;")
        # NaN stays NaN through the tree: a max/min takes the other value only when it is larger/smaller or NaN
        pick = {"max": ">", "min": "<"}.get(op)
        lines.append(f"{self.local_prefix} {ct} sh[{group * members}];")
        lines += [f"sh[{li} + {m * group}] = {a};" if m else f"sh[{li}] = {a};" for m, a in enumerate(accs)]
        lines += [self.barrier, f"for (int s = {group // 2}; s > 0; s >>= 1) {{", f"  if ({li} < s) {{"]
        for m in range(members):
            at = f"{li} + {m * group}" if m else li
            mine, other = f"sh[{at}]", f"sh[{at} + s]"
            comb = f"({other} {pick} {mine} || {other} != {other}) ? {other} : {mine}" if pick else None
            lines.append(f"    {mine} = " + (comb if comb else _combine(op, mine, other)) + ";")
        lines += ["  }", f"  {self.barrier}", "}", f"if ({li} == 0) {{"]
        each = out.size // members
        for m in range(members):
            lines.append("  " + self.store(out.dtype, "b0", f"{w} + {m * each}" if m else w, f"sh[{m * group}]"))
        lines.append("}")
        return self._finish("R", out, params, lines, (each * group,), (group,))

    def _render_unrolled_reduce(
        self,
        b: ExprBuilder,
        out: Node,
        src: Node,
        op: str,
        axes: tuple[int, ...],
        keep: tuple[int, ...],
        params: list[str],
    ) -> RenderedKernel:
        """A short reduction (a pooling window's axis, a few stacked views) written out term by term: every term's
        position is a constant, so a stack's source is chosen at render time instead of branched on per element,
        and the loop over outputs vectorises (a vector loop over three window elements leaves the unit idle)."""
        red = tuple(src.shape[a] for a in axes)
        head, cs = self._row_coords(b, keep)
        ocs = cs if cs is not None else b.coords(Idx(keep, linear="gid"))
        # NaN propagates as in NumPy: a NaN term is taken, and once acc is NaN no comparison replaces it (one select
        # per term; a separate flag costs a vector loop several times more)
        nan_ok = src.dtype.is_float and op in ("max", "min")
        b.lines.append(f"{self.compute_type(src.dtype)} acc = {self.literal(_reduce_init(op, src.dtype), src.dtype)};")
        for r in range(math.prod(red)):
            full = list(ocs)
            for a, c in zip(axes, _unravel(r, red), strict=True):
                full[a] = str(c)
            v = b.value(src, Idx(src.shape, coords=full))
            if nan_ok:
                b.lines.append(f"acc = ({v} {'>' if op == 'max' else '<'} acc || {v} != {v}) ? {v} : acc;")
            else:
                b.lines.append("acc = " + _combine(op, "acc", v) + ";")
        b.lines.append(self.store(out.dtype, "b0", "gid", "acc"))
        simd_ok = b.cat_parts <= MAX_SIMD_CAT_PARTS
        body, gs, ls = self._loop(b, head, keep, out.size, b.idx_t, out.size * len(b.lines), simd_ok)
        return self._finish("R", out, params, body, gs, ls)


def _unravel(r: int, shape: tuple[int, ...]) -> list[int]:
    """Row-major coordinates of linear position `r` in `shape`."""
    cs = []
    for s in reversed(shape):
        cs.append(r % s)
        r //= s
    return cs[::-1]


def _reduce_init(op: str, dt: DType) -> Any:
    """The identity of a reduction in dtype `dt` (integers have no infinities: their extreme values instead)."""
    if op in ("max", "argmax", "min", "argmin") and not dt.is_float:
        lim = 2**63 - 1 if dt == dtypes.int64 else 2**31 - 1
        return -lim - 1 if op in ("max", "argmax") else lim
    return _IDENTITY["max" if op == "argmax" else "min" if op == "argmin" else op]


def _combine(op: str, a: str, v: str) -> str:
    return {
        "sum": f"{a} + {v}",
        "prod": f"{a} * {v}",
        "max": f"({v} > {a} ? {v} : {a})",
        "min": f"({v} < {a} ? {v} : {a})",
    }[op]
