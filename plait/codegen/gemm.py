"""GEMM templates with tunable knobs: one for C (packed panels, a register-blocked vector micro-kernel, OpenMP)
and one for OpenCL (local-memory tiles, register blocking per work-item).

Operands are strided views: A[b, m, k] = a[a_off + b*sab + m*sam + k*sak], likewise B; C is contiguous
(batch, M, N). Transposes and broadcast batch dims therefore cost no copy.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from plait.codegen import conv_s2_c, gemm_c, pointwise_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.codegen.expr import ExprBuilder, Idx
from plait.errors import CompileError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops.conv import Window


@dataclass(frozen=True)
class GemmSpec:
    batch: int
    m: int
    n: int
    k: int
    a: tuple[int, int, int, int]  # offset, batch stride, m stride, k stride
    b: tuple[int, int, int, int]  # offset, batch stride, k stride, n stride
    inner: int = 1  # batch index bz splits as (bz // inner, bz % inner): two batch dims (e.g. image, group)
    a_inner: int = 0  # A's stride along the inner batch dim
    b_inner: int = 0
    conv: Window | None = None  # B is the patch columns of this window over an NCHW image (implicit GEMM)
    # B is the transposed folded patch columns of this window (a weight gradient: K runs over images x positions,
    # the columns over C*kh*kw), gathered from the NCHW image; `b` keeps the strides of the columns it stands for
    conv_t: Window | None = None
    # A is a folded convolution's output gradient (C, N*P) (`a` keeps the strides of that layout) read in place from
    # the NCHW buffer it is a permuted view of: (P, C*P), the plane and the image stride (see `nchw_a_at`)
    a_nchw: tuple[int, int] | None = None

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k

    def a_at(self, bz: int) -> int:
        """The offset of batch entry `bz`'s first A element, in the layout `a` describes."""
        return self.a[0] + bz // self.inner * self.a[1] + bz % self.inner * self.a_inner

    def b_at(self, bz: int) -> int:
        """The offset of batch entry `bz`'s first B element, in the layout `b` describes."""
        return self.b[0] + bz // self.inner * self.b[1] + bz % self.inner * self.b_inner


@dataclass(frozen=True)
class Epilogue:
    """An elementwise expression `root` applied to each product element (node `mm`) before it is stored; it may
    read `extra` buffers at the same element (bias, residual, BN scale/shift)."""

    root: Node
    mm: Node
    extra: tuple[Node, ...]


def _epi(
    r: Any,
    epi: Epilogue | None,
    value: str,
    index: str,
    indent: str,
    idx_t: str = "long",
    coords: list[str] | None = None,
    carried: Carried | None = None,
) -> tuple[str, str, str]:
    """(statements, result expression, extra kernel parameters) for storing `value` at linear `index` (or at
    per-axis `coords` of the epilogue's shape, when the caller has them). With a `carried` residual, `value` is
    the residual plus the product's (scaled) term: the term reads as `value`, the residual as zero."""
    if epi is None:
        return "", value, ""
    args = {n.uid: f"e{i}" for i, n in enumerate(epi.extra)}
    subst = {epi.mm.uid: value}
    if carried is not None:
        subst = {carried.term.uid: value, carried.residual.uid: "0.0f"}
    b = ExprBuilder(r, args, idx_t, subst=subst)
    where = Idx(epi.root.shape, coords=coords) if coords else Idx(epi.root.shape, linear=b.tmp(idx_t, index, "i"))
    v = b.value(epi.root, where)
    params = "".join(", " + r.param(n.dtype, f"e{i}", False) for i, n in enumerate(epi.extra))
    return "".join(f"{indent}{ln}\n" for ln in b.lines), v, params


CL_DEFAULT = {"TSM": 64, "TSN": 64, "TSK": 16, "WPTM": 4, "WPTN": 4}


def _finish(kind: str, spec: GemmSpec, src: str, gs: tuple[int, ...], ls: tuple[int, ...] | None) -> RenderedKernel:
    digest = hashlib.sha256(src.encode()).hexdigest()[:10]
    name = f"{kind}_{spec.batch}x{spec.m}x{spec.n}x{spec.k}_{digest}"
    return RenderedKernel(name, src.replace("KERNEL_NAME", name), gs, ls)


def _tile_coords(
    shape: tuple[int, ...], batch: int, m: int, n: int, rows: str = "(i0 + i)", cols: str = "(j0 + j)"
) -> list[str] | None:
    """Per-axis coordinates of C element (bz, i0 + i, j0 + j) in `shape` when its axes split in order into batch,
    row and column groups; then a per-channel operand (BN, bias) is read at a row-constant index (one broadcast
    per row instead of a division and a gather per element). None when the axes do not split that way."""
    groups: list[list[int]] = [[], [], []]
    part, size = 0, 1
    for ax, d in enumerate(shape):
        while part < 2 and size == (batch, m)[part] and d != 1:
            part, size = part + 1, 1
        groups[part].append(ax)
        size *= d
    sizes = [math.prod(shape[a] for a in g) for g in groups]
    if sizes != [batch, m, n]:
        return None
    coords = ["0"] * len(shape)
    for g, var in zip(groups, ("bz", rows, cols), strict=True):
        inner = 1
        for ax in reversed(g):
            d = shape[ax]
            if d != 1:
                q = var if inner == 1 else f"({var} / {inner})"
                coords[ax] = q if inner * d == math.prod(shape[a] for a in g) else f"({q} % {d})"
            inner *= d
    return coords


def direct_conv(spec: GemmSpec) -> bool:
    """True when the C kernel of `spec` is the direct few-channel convolution (an image stem), which has no knobs:
    it ran 0.67-0.92x the GEMM's time on every stem measured, so a tuned MR/NR entry (from a cache written before the
    direct kernel, or a noisy tuning run) must not put the stem back on the GEMM."""
    return spec.conv is not None and spec.a[3] == 1 and gemm_c.use_direct(spec.conv, spec.m, spec.k)


def _c_form(spec: GemmSpec, kn: dict[str, int]) -> tuple[bool, bool, bool, bool]:
    """How render_c runs `spec` on cpu: (small: the GEMV for a few rows, vec: a matrix-vector product, trans: C^T
    computed, pointwise: B streamed by the 1x1 kernel); none of them: the GEMM library's plait_sgemm."""
    m, n, k = spec.m, spec.n, spec.k
    sbk, sbn = spec.b[2], spec.b[3]
    small = spec.conv is None and gemm_c.use_gemv(m, n, k, spec.batch, sbk, sbn, kn.get("SMALL_M", 4))
    # a matrix-vector product (n == 1) is a GEMV of the transposed problem; C and C^T are the same vector
    vec = not small and n == 1 and spec.conv is None
    # a narrow product (few columns, many rows: linear layers, late layers at batch 1) computes C^T = B^T A^T
    # instead, so the wide side fills the vector micro-tile
    # so does a product whose B is stored transposed (a linear layer's weight) with fewer rows than columns: then
    # B^T is read in place and only the small A is gathered into panels
    narrow_c = n < gemm_c.VW and m > n
    transposed_b = sbk == 1 and sbn != 1 and m < n
    trans = not small and not vec and spec.conv is None and (narrow_c or transposed_b)
    # few rows over long contiguous rows of B (1x1 convolutions with few output channels): B streamed, not packed
    pointwise = not small and not vec and not trans and "MR" not in kn and pointwise_c.fits(spec)
    return small, vec, trans, pointwise


def _c_tile(spec: GemmSpec) -> tuple[int, int]:
    """The heuristic register tile (rows, vectors) of an untransposed C GEMM; narrow products sharing A over the
    batch run as one product over all batch entries' columns."""
    merged = spec.batch > 1 and spec.n < gemm_c.MERGE_BELOW and spec.a_inner == 0
    merged = merged and (spec.a[1] == 0 or spec.batch == spec.inner)
    return gemm_c.pick_tile(spec.m, spec.n * spec.batch if merged else spec.n)


def packed_tile(spec: GemmSpec) -> tuple[int, int] | None:
    """The register tile of `spec` when render_c runs it on the GEMM library untransposed, with A shared by every
    batch entry (so one packing of A serves them all): then A may be packed at plan build (gemm_c.APack). None for
    every other form (GEMV, the transposed product, the few-row pointwise kernel, depthwise and direct
    convolutions)."""
    if not gemm_c.APACK or spec.a_nchw is not None or direct_conv(spec) or (spec.conv is not None and spec.m == 1):
        return None
    small, vec, trans, pointwise = _c_form(spec, {})
    if small or vec or trans or pointwise:
        return None
    if spec.batch > 1 and (spec.a[1] != 0 or spec.a_inner != 0):
        return None
    return _c_tile(spec)


def _leaf_paths(node: Node, leaves: set[int], path: tuple[Node, ...], out: dict[int, list[tuple[Node, ...]]]) -> None:
    """Every path from the epilogue's root down to each leaf (the product or an extra operand) it reads."""
    path = (*path, node)
    if node.uid in leaves:
        out.setdefault(node.uid, []).append(path)
        return
    for src in node.srcs:
        _leaf_paths(src, leaves, path, out)


@dataclass(frozen=True)
class Carried:
    """A residual a cpu GEMM takes in C's storage: `term`, the product's node in the epilogue (the product itself,
    or it times a per-row `scale`, which the micro-kernel applies), and `residual`, whose term then reads as zero."""

    residual: Node
    term: Node
    scale: Node | None


def _row_scale(spec: GemmSpec, mul: Node, below: Node, extra: tuple[Node, ...]) -> Node | None:
    """The extra operand s when `mul` is `below` times s[i] at C's row i (a batch norm's scale broadcast over the
    channel axis: expand(reshape(s)) with s of m values), else None."""
    (other,) = [x for x in mul.srcs if x is not below] or [below]
    if other is below or other.op != "expand" or other.shape != mul.shape:
        return None
    src = other.srcs[0]
    axes = [a for a, d in enumerate(src.shape) if d != 1]
    if len(src.shape) != len(mul.shape) or len(axes) != 1 or src.shape[axes[0]] != spec.m:
        return None
    p = axes[0]
    if math.prod(mul.shape[:p]) != spec.batch or math.prod(mul.shape[p + 1 :]) != spec.n:
        return None
    while src.op == "reshape" and all(src is not x for x in extra):
        src = src.srcs[0]
    known = any(src is x for x in extra)
    return src if known and src.dtype.name == "float32" and math.prod(src.shape) == spec.m else None


def carried_residual(spec: GemmSpec, knobs: dict[str, int] | None, epi: Epilogue | None) -> Carried | None:
    """The residual operand R that a cpu GEMM can take in C's storage (C holds R on entry, the product is added to
    it, the epilogue drops R's term), else None. That saves reading R in the epilogue besides C (ORT's fused
    Conv+Sum). It needs the GEMM library's form and an epilogue f(... (term + R) ...) where the term (the product,
    or the product times a per-row scale: an unfolded batch norm) and R each appear once, meet at an add, and below
    it pass only adds and reshapes: then R is read at C's element and nothing scales it apart from the product
    (a shift or bias added on the way stays right)."""
    if epi is None or spec.a_nchw is not None or (spec.conv is not None and (spec.m == 1 or direct_conv(spec))):
        return None
    if any(_c_form(spec, knobs or {})) or epi.root.dtype.name != "float32" or epi.mm.dtype.name != "float32":
        return None
    size = math.prod(epi.root.shape)
    paths: dict[int, list[tuple[Node, ...]]] = {}
    _leaf_paths(epi.root, {epi.mm.uid, *(x.uid for x in epi.extra)}, (), paths)
    if len(paths.get(epi.mm.uid, [])) != 1:
        return None
    (mm_path,) = paths[epi.mm.uid]
    top = len(mm_path) - 1  # the product's term: the product, through reshapes, times at most one row scale
    while top > 1 and mm_path[top - 1].op == "reshape":
        top -= 1
    scale = None
    if top > 1 and mm_path[top - 1].op == "mul":
        scale = _row_scale(spec, mm_path[top - 1], mm_path[top], epi.extra)
        top = top - 1 if scale is not None else top
    t_path = mm_path[: top + 1]
    for x in epi.extra:
        if math.prod(x.shape) != size or x.dtype.name != "float32" or len(paths.get(x.uid, [])) != 1:
            continue
        (r_path,) = paths[x.uid]
        meet = 0
        while meet + 2 < min(len(t_path), len(r_path)) and t_path[meet + 1] is r_path[meet + 1]:
            meet += 1
        below = t_path[meet + 1 : -1] + r_path[meet + 1 : -1]
        if t_path[meet].op == "add" and t_path[meet] is r_path[meet] and all(n.op in ("add", "reshape") for n in below):
            return Carried(x, t_path[-1], scale)
    return None


def render_c(
    spec: GemmSpec,
    knobs: dict[str, int] | None = None,
    r: Any = None,
    epi: Epilogue | None = None,
    lanes: pointwise_c.LanesPlan | None = None,
    residual: Node | None = None,
    apack: gemm_c.APack | None = None,
) -> RenderedKernel:
    """A C kernel for `spec`: a call into the shared GEMM library (or the GEMV for a few rows) plus its epilogue.
    Knobs MR and NR (a multiple of 16) fix the register tile; without them the tile that pads least is used. With
    `lanes`, A is the weight packed at plan build and the product runs across the lanes (pointwise_c.lanes_call; a
    stride-2 3x3 convolution, conv_s2_c.call). With `residual` (carried_residual's), C holds it on entry. With
    `apack`, A is the weight packed at plan build in that register tile's order (packed_tile said the spec runs on
    the GEMM library), which fixes the tile whatever `knobs` say."""
    if spec.a_nchw is not None:
        raise UnsupportedError(f"C GEMM {spec}: an output gradient read in place from NCHW (a_nchw) is OpenCL's form")
    kn = knobs or {}
    if apack is not None:
        kn = {"MR": apack.mr, "NR": apack.nv * gemm_c.VW}
    ao, sab, sam, sak = spec.a
    bo, sbb, sbk, sbn = spec.b
    m, n, k = spec.m, spec.n, spec.k
    small, vec, trans, pointwise = _c_form(spec, kn)
    if "MR" in kn and "NR" in kn:
        mr, nv = kn["MR"], max(1, kn["NR"] // gemm_c.VW)
    else:
        mr, nv = gemm_c.pick_tile(n, m) if trans else _c_tile(spec)
    # 32-bit index arithmetic where it fits lets the compiler vectorise the epilogue (divisions by constants)
    narrow = spec.batch * m * n < 2**31
    index = (
        f"(int)bz * {m * n} + (i0 + i) * {n} + j0 + j" if narrow else f"bz * {m * n}L + (long)(i0 + i) * {n} + j0 + j"
    )
    # the GEMV of a matrix-vector product runs transposed: its column index is the product's row
    rows, cols = ("(j0 + j)", "(i0 + i)") if vec else ("(i0 + i)", "(j0 + j)")
    coords = _tile_coords(epi.root.shape, spec.batch, m, n, rows, cols) if epi is not None else None
    if coords is not None and spec.conv is not None and m == 1:
        # a depthwise kernel's epilogue runs on `mr` consecutive planes at once (row i is plane bz + i)
        coords = [c.replace("bz", "(bz + i)") for c in coords]
    carry = carried_residual(spec, kn, epi) if residual is not None else None
    if residual is not None and (carry is None or carry.residual is not residual):
        raise CompileError(f"C GEMM {spec}: the residual {residual.op} {residual.shape} cannot be carried in C here")
    stmts, res, params = _epi(r, epi, "v", index, "      ", "int" if narrow else "long", coords, carry)
    epi_fn, extra, epilogue, holder = "0", "0", "", ""
    if epi is not None:
        loads = "".join(
            f"  const {r.storage_type(x.dtype)}* restrict e{i} = extra[{i}];\n" for i, x in enumerate(epi.extra)
        )
        epi_fn, extra = "epi_KERNEL_NAME", "extra"
        # residuals (read at C's element index) of the next row block, prefetched where rows run in blocks (C GEMM)
        depthwise = spec.conv is not None and m == 1
        gemm_lib = not (lanes or depthwise or direct_conv(spec) or pointwise or small or vec or trans)
        # an operand as large as C is a residual read at C's element index (a wrong guess costs only the hints)
        size = math.prod(epi.root.shape)
        full = [
            f"e{i}"
            for i, x in enumerate(epi.extra)
            if math.prod(x.shape) == size and coords is not None and x is not residual
        ]
        ahead = gemm_c.epi_prefetch(full, m, n) if gemm_lib else ""
        # a simd row loop: comparisons (ReLU6's select) become masks instead of mispredicted branches
        epilogue = f"""static void epi_KERNEL_NAME(float* restrict c, long bz, int i0, int j0, int mr, int nr, void* const* extra) {{
{loads}{ahead}  for (int i = 0; i < mr; i++) {{
#pragma omp simd
    for (int j = 0; j < nr; j++) {{
      float v = c[(long)(i0 + i) * {n} + j0 + j];
{stmts}      c[(long)(i0 + i) * {n} + j0 + j] = {res};
    }}
  }}
}}
"""
        holder = f"  void* const extra[] = {{{', '.join(f'(void*)e{i}' for i in range(len(epi.extra))) or '0'}}};\n"
    a_args = f"A + {ao}, {sab}, {spec.a_inner}, {sam}, {sak}" if apack is None else "A, 0, 0, 0, 0"
    b_args = f"B + {bo}, {sbb}, {spec.b_inner}, {sbk}, {sbn}"
    if lanes is not None and spec.conv is not None:
        lib = conv_s2_c.library(lanes)
        call = conv_s2_c.call(spec, lanes, f"B + {bo}, {sbb}, {spec.b_inner}", epi_fn, extra)
    elif lanes is not None:
        lib = pointwise_c.lanes_library(lanes.mr, lanes.nv)
        call = pointwise_c.lanes_call(spec, lanes, f"B + {bo}, {sbb}, {spec.b_inner}, {sbk}", epi_fn, extra)
    elif spec.conv is not None and m == 1:
        lib = gemm_c.depthwise_library()
        call = gemm_c.depthwise_call(
            spec, f"A + {ao}, {sab}, {spec.a_inner}", f"B + {bo}, {sbb}, {spec.b_inner}", epi_fn, extra
        )
    elif direct_conv(spec):
        lib = gemm_c.direct_library(spec.conv, spec.m, spec.k)
        a_rows, image = f"A + {ao}, {sab}, {spec.a_inner}, {sam}", f"B + {bo}, {sbb}, {spec.b_inner}"
        call = gemm_c.direct_call(spec, a_rows, image, epi_fn, extra)
    elif pointwise:
        mr, nv = pointwise_c.pick_tile(m, k)
        lib = pointwise_c.library(mr, nv)
        call = pointwise_c.call(spec, mr, nv, a_args, f"B + {bo}, {sbb}, {spec.b_inner}, {sbk}", epi_fn, extra)
    elif small or vec:
        lib = gemm_c.gemv_library()
        if vec:
            a_args = f"B + {bo}, {sbb}, {spec.b_inner}, {sbn}, {sbk}"
            b_args = f"A + {ao}, {sab}, {spec.a_inner}, {sak}, {sam}"
            m, n = n, m
        call = f"  plait_sgemv({spec.batch}, {spec.inner}, {m}, {n}, {k}, {a_args}, {b_args}, C, {epi_fn}, {extra});\n"
    else:
        lib = gemm_c.library(mr, nv)
        fn = f"plait_sgemm_{mr}x{nv}"
        if trans:
            assert apack is None, "a packed A runs only untransposed"
            swapped = GemmSpec(spec.batch, n, m, k, spec.b, spec.a, spec.inner, spec.b_inner, spec.a_inner)
            bt_args = f"B + {bo}, {sbb}, {spec.b_inner}, {sbn}, {sbk}"
            at_args = f"A + {ao}, {sab}, {spec.a_inner}, {sak}, {sam}"
            call = gemm_c.call(fn, swapped, bt_args, at_args, True, epi_fn, extra)
        else:
            scale = carry.scale if carry is not None else None
            sc = next((f"e{i}" for i, x in enumerate(epi.extra) if x is scale), "0") if epi is not None else "0"
            call = gemm_c.call(fn, spec, a_args, b_args, False, epi_fn, extra, carry is not None, sc, apack is not None)
    args = ["float* restrict C", "const float* restrict A", "const float* restrict B", *params.split(", ")[1:]]
    src = entry_points("KERNEL_NAME", args, holder + call, f"{lib}/* KERNEL_NAME */\n{epilogue}")
    kind = (
        "S2CONV"
        if lanes is not None and spec.conv is not None
        else "PWLANES"
        if lanes is not None
        else "DWCONV"
        if spec.conv is not None and m == 1
        else "CONV"
        if spec.conv is not None
        else "GEMV"
        if small or vec
        else "GEMM"
    )
    return _finish(kind, spec, src, (1,), None)


def conv_wide(spec: GemmSpec) -> bool:
    """True when an implicit convolution's image offsets or column indices may pass 2^31 (64-bit index math).

    Elsewhere the gather's index arithmetic is 32-bit: it runs once per B element, and NVIDIA GPUs divide and
    multiply 64-bit integers in several instructions each."""
    win = spec.conv
    assert win is not None
    plane = win.h * win.w
    reach = spec.batch // spec.inner * abs(spec.b[1]) + spec.inner * abs(spec.b_inner) + win.c * plane
    return max(win.n * win.c * plane, reach, spec.batch * spec.n) >= 2**31


def conv_column(spec: GemmSpec, col: str, fold: bool) -> str:
    """Declarations placing column `col` of an implicit-convolution spec in the image: o_, the offset of its
    batch entry (with `fold`, else 0) and image, and iy0_, ix0_, the top-left corner of its window (padding
    included). A product whose columns are every image's output positions in turn (the batch folded into the
    columns by the graph: n = images x OH*OW) finds the image of each column here."""
    win = spec.conv
    assert win is not None
    idx, lit = ("long", "L") if conv_wide(spec) else ("int", "")
    plane = win.oh * win.ow
    decls = f"const {idx} q_ = {col};"
    if fold:
        n, inner = spec.n, spec.inner
        off = (
            f"i_ / {inner} * {spec.b[1]}{lit} + i_ % {inner} * {spec.b_inner}{lit}"
            if inner > 1
            else f"i_ * {spec.b[1]}{lit}"
        )
        decls += f" const {idx} i_ = q_ / {n}, r_ = q_ % {n}, o0_ = {off};"
    else:
        decls += f" const {idx} r_ = q_, o0_ = 0;"
    if spec.n != plane:  # columns span the images
        decls += (
            f" const {idx} o_ = o0_ + r_ / {plane} * {win.c * win.h * win.w}{lit}; const int j_ = (int)(r_ % {plane});"
        )
    else:
        decls += f" const {idx} o_ = o0_; const int j_ = (int)r_;"
    return decls + f" const int iy0_ = j_ / {win.ow} * {win.sh} - {win.ph}, ix0_ = j_ % {win.ow} * {win.sw} - {win.pw};"


def conv_gather(spec: GemmSpec, k: str, col: str, cond: str, fold: bool = False) -> tuple[str, str]:
    """(declarations, value) reading element B[k, col] of an implicit-convolution spec straight from the image
    through the window (stride, padding, dilation): 0 outside the image or where `cond` fails. With `fold`,
    `col` runs over every batch entry's columns (entry col / n) and the batch offset is added here."""
    win = spec.conv
    assert win is not None
    taps, plane = win.kh * win.kw, win.h * win.w
    idx = "long" if conv_wide(spec) else "int"
    decls = f"const int p_ = {k}; {conv_column(spec, col, fold)}"
    decls += (
        f" const int t_ = p_ % {taps}, iy_ = iy0_ + t_ / {win.kw} * {win.dh}, ix_ = ix0_ + t_ % {win.kw} * {win.dw};"
    )
    inside = f"(uint)iy_ < {win.h}u && (uint)ix_ < {win.w}u"
    value = f"({cond} && {inside}) ? b[o_ + ({idx})(p_ / {taps}) * {plane} + iy_ * {win.w} + ix_] : 0.0f"
    return decls, value


def _cl_operands(spec: GemmSpec) -> str:
    """The batch `bz`'s A, B and C pointers inside an OpenCL GEMM kernel (two-level batch strides). For a
    `conv_t` spec B is the image itself, and the batch entry's place in the columns it stands for is (row0_, pos0_):
    its first column's patch row and its first k's position (image x output position)."""
    (ao, sab, _, _), (bo, sbb, _, _), i = spec.a, spec.b, spec.inner
    b_off = f"{bo} + bz / {i} * {sbb}L + bz % {i} * {spec.b_inner}L"
    b = f"  __global const float* b = B + {b_off};\n"
    if spec.conv_t is not None:
        span = spec.conv_t.n * spec.conv_t.oh * spec.conv_t.ow
        b = (
            f"  __global const float* b = B;\n  const long eb_ = {b_off};\n"
            f"  const int row0_ = (int)(eb_ / {span}), pos0_ = (int)(eb_ % {span});\n"
        )
    a_off = f"{ao} + bz / {i} * {sab}L + bz % {i} * {spec.a_inner}L"
    a = f"  __global const float* a = A + {a_off};\n"
    if spec.a_nchw is not None:
        s = spec.a[2]
        a = (
            f"  __global const float* a = A;\n  const long ea_ = {a_off};\n"
            f"  const int arow0_ = (int)(ea_ / {s}), apos0_ = (int)(ea_ % {s});\n"
        )
    return f"{a}{b}  __global float* c = C + bz * {spec.m * spec.n}L;\n"


def nchw_a_at(spec: GemmSpec, row: str, k: str) -> str:
    """The address of A[row, k] of an `a_nchw` spec in its NCHW buffer: k is an (image, position) past apos0_ of
    the (C, N*P) layout, row a channel past arow0_. One division by the plane per element replaces the copy that
    wrote the output gradient a second time in the (C, N*P) layout (vgg16 b64: 1.64 ms for its 224x224 layers)."""
    assert spec.a_nchw is not None
    plane, image = spec.a_nchw
    return f"(long)((apos0_ + {k}) / {plane}) * {image} + (long)(arow0_ + {row}) * {plane} + (apos0_ + {k}) % {plane}"


def _a_load(spec: GemmSpec, dest: str) -> str:
    """The statement of the FP32 templates that loads A[gm, gk] (0 outside the product) into `dest`."""
    cond = f"gm < {spec.m} && gk < {spec.k}"
    if spec.a_nchw is not None:
        return f"{dest} = ({cond}) ? a[{nchw_a_at(spec, 'gm', 'gk')}] : 0.0f;"
    _, _, sam, sak = spec.a
    return f"{dest} = ({cond}) ? a[(long)gm * {sam} + (long)gk * {sak}] : 0.0f;"


def conv_t_gather(spec: GemmSpec, k: str, col: str, cond: str) -> tuple[str, str]:
    """(declarations, value) reading element B[k, col] of a `conv_t` spec (the transposed folded patch columns)
    from the image: k is an (image, output position) past pos0_, col a (channel, kernel tap) past row0_; 0 outside
    the image or where `cond` fails."""
    win = spec.conv_t
    assert win is not None
    taps, plane = win.kh * win.kw, win.oh * win.ow
    decls = (
        f"const int pk_ = pos0_ + {k}, row_ = row0_ + {col}, pp_ = pk_ % {plane}, t_ = row_ % {taps};"
        f" const int iy_ = pp_ / {win.ow} * {win.sh} - {win.ph} + t_ / {win.kw} * {win.dh},"
        f" ix_ = pp_ % {win.ow} * {win.sw} - {win.pw} + t_ % {win.kw} * {win.dw};"
    )
    at = f"pk_ / {plane} * {win.c * win.h * win.w} + row_ / {taps} * {win.h * win.w} + iy_ * {win.w} + ix_"
    return decls, f"({cond} && (uint)iy_ < {win.h}u && (uint)ix_ < {win.w}u) ? b[{at}] : 0.0f"


def _b_load(spec: GemmSpec, dest: str) -> str:
    """The statement of the FP32 templates that loads B[gk, gn] (0 outside the product) into `dest`."""
    cond = f"gn < {spec.n} && gk < {spec.k}"
    if spec.conv is not None:
        decls, value = conv_gather(spec, "gk", "gn", cond)
        return f"{{ {decls} {dest} = {value}; }}"
    if spec.conv_t is not None:
        decls, value = conv_t_gather(spec, "gk", "gn", cond)
        return f"{{ {decls} {dest} = {value}; }}"
    _, _, sbk, sbn = spec.b
    return f"{dest} = ({cond}) ? b[(long)gk * {sbk} + (long)gn * {sbn}] : 0.0f;"


def _render_opencl_v2(spec: GemmSpec, tsk: int, r: Any, epi: Epilogue | None) -> RenderedKernel:
    """128x128 tiles, 8x8 outputs per work-item as two 4-wide groups 64 apart, so local-memory reads are
    conflict-free float4 loads (16 FMAs per load instead of 4)."""
    sak = spec.a[3]
    sbn = spec.b[3]
    m, n, k = spec.m, spec.n, spec.k
    a_map = "int mm = l / TSK, kk = l % TSK;" if sak == 1 else "int kk = l / 128, mm = l % 128;"
    b_map = (
        "int kk = l / 128, nn = l % 128;" if sbn == 1 or spec.conv is not None else "int nn = l / TSK, kk = l % TSK;"
    )
    stmts, res, params = _epi(r, epi, "acc[i][j]", f"bz * {m * n}L + (long)gm * {n} + gn", "        ")
    src = f"""/* KERNEL_NAME */
#define TSK {tsk}
__kernel __attribute__((reqd_work_group_size(16, 16, 1))) void KERNEL_NAME(__global float* restrict C, __global const float* restrict A, __global const float* restrict B{params}) {{
  const int tn = get_local_id(0), tm = get_local_id(1);
  const int tid = tm * 16 + tn;
  const int n0 = get_group_id(0) * 128, m0 = get_group_id(1) * 128;
  const long bz = get_global_id(2);
{_cl_operands(spec)}  __local float As[TSK][128];
  __local float Bs[TSK][128];
  float acc[8][8];
  for (int i = 0; i < 8; i++) for (int j = 0; j < 8; j++) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < {k}; k0 += TSK) {{
    for (int l = tid; l < TSK * 128; l += 256) {{
      {a_map}
      int gm = m0 + mm, gk = k0 + kk;
      {_a_load(spec, "As[kk][mm]")}
    }}
    for (int l = tid; l < TSK * 128; l += 256) {{
      {b_map}
      int gn = n0 + nn, gk = k0 + kk;
      {_b_load(spec, "Bs[kk][nn]")}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
#pragma unroll
    for (int kk = 0; kk < TSK; kk++) {{
      float4 a0 = vload4(0, &As[kk][tm * 4]), a1 = vload4(0, &As[kk][64 + tm * 4]);
      float4 b0 = vload4(0, &Bs[kk][tn * 4]), b1 = vload4(0, &Bs[kk][64 + tn * 4]);
      float av[8] = {{a0.s0, a0.s1, a0.s2, a0.s3, a1.s0, a1.s1, a1.s2, a1.s3}};
      float bv[8] = {{b0.s0, b0.s1, b0.s2, b0.s3, b1.s0, b1.s1, b1.s2, b1.s3}};
      for (int i = 0; i < 8; i++) for (int j = 0; j < 8; j++) acc[i][j] = fma(av[i], bv[j], acc[i][j]);
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  for (int i = 0; i < 8; i++) {{
    int gm = m0 + (i < 4 ? tm * 4 + i : 64 + tm * 4 + i - 4);
    if (gm >= {m}) continue;
    for (int j = 0; j < 8; j++) {{
      int gn = n0 + (j < 4 ? tn * 4 + j : 64 + tn * 4 + j - 4);
      if (gn >= {n}) continue;
{stmts}      c[(long)gm * {n} + gn] = {res};
    }}
  }}
}}
#undef TSK
"""
    gs = (-(-n // 128) * 16, -(-m // 128) * 16, spec.batch)
    return _finish("GEMM", spec, src, gs, (16, 16, 1))


def render_opencl(
    spec: GemmSpec, knobs: dict[str, int] | None = None, r: Any = None, epi: Epilogue | None = None
) -> RenderedKernel:
    if (knobs or {}).get("V") == 3:
        from plait.codegen import gemm_tc

        return gemm_tc.render(spec, knobs or {}, r, epi)
    if (knobs or {}).get("V") == 4:
        from plait.codegen import gemm_small

        return gemm_small.render(spec, r, epi)
    kn = {**CL_DEFAULT, **(knobs or {})}
    if kn.get("V") == 2:
        return _render_opencl_v2(spec, kn["TSK"], r, epi)
    tsm, tsn, tsk, wm, wn = kn["TSM"], kn["TSN"], kn["TSK"], kn["WPTM"], kn["WPTN"]
    rm, rn = tsm // wm, tsn // wn
    nt = rm * rn
    sak = spec.a[3]
    sbn = spec.b[3]
    m, n, k = spec.m, spec.n, spec.k
    a_map = "int mm = l / TSK, kk = l % TSK;" if sak == 1 else "int kk = l / TSM, mm = l % TSM;"
    b_map = (
        "int kk = l / TSN, nn = l % TSN;" if sbn == 1 or spec.conv is not None else "int nn = l / TSK, kk = l % TSK;"
    )
    stmts, res, params = _epi(r, epi, "acc[i][j]", f"bz * {m * n}L + (long)gm * {n} + gn", "        ")
    src = f"""/* KERNEL_NAME */
#define TSM {tsm}
#define TSN {tsn}
#define TSK {tsk}
#define WPTM {wm}
#define WPTN {wn}
#define RTSM {rm}
#define RTSN {rn}
__kernel __attribute__((reqd_work_group_size(RTSN, RTSM, 1))) void KERNEL_NAME(__global float* restrict C, __global const float* restrict A, __global const float* restrict B{params}) {{
  const int tn = get_local_id(0), tm = get_local_id(1);
  const int tid = tm * RTSN + tn;
  const int n0 = get_group_id(0) * TSN, m0 = get_group_id(1) * TSM;
  const long bz = get_global_id(2);
{_cl_operands(spec)}  __local float As[TSK][TSM];
  __local float Bs[TSK][TSN];
  float acc[WPTM][WPTN];
  for (int i = 0; i < WPTM; i++) for (int j = 0; j < WPTN; j++) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < {k}; k0 += TSK) {{
    for (int l = tid; l < TSK * TSM; l += {nt}) {{
      {a_map}
      int gm = m0 + mm, gk = k0 + kk;
      {_a_load(spec, "As[kk][mm]")}
    }}
    for (int l = tid; l < TSK * TSN; l += {nt}) {{
      {b_map}
      int gn = n0 + nn, gk = k0 + kk;
      {_b_load(spec, "Bs[kk][nn]")}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < TSK; kk++) {{
      float br[WPTN];
      for (int j = 0; j < WPTN; j++) br[j] = Bs[kk][tn + j * RTSN];
      for (int i = 0; i < WPTM; i++) {{
        float av = As[kk][tm + i * RTSM];
        for (int j = 0; j < WPTN; j++) acc[i][j] = fma(av, br[j], acc[i][j]);
      }}
    }}
    barrier(CLK_LOCAL_MEM_FENCE);
  }}
  for (int i = 0; i < WPTM; i++) {{
    int gm = m0 + tm + i * RTSM;
    if (gm >= {m}) continue;
    for (int j = 0; j < WPTN; j++) {{
      int gn = n0 + tn + j * RTSN;
      if (gn >= {n}) continue;
{stmts}      c[(long)gm * {n} + gn] = {res};
    }}
  }}
}}
#undef TSM
#undef TSN
#undef TSK
#undef WPTM
#undef WPTN
#undef RTSM
#undef RTSN
"""
    gs = (-(-n // tsn) * rn, -(-m // tsm) * rm, spec.batch)
    return _finish("GEMM", spec, src, gs, (rn, rm, 1))
