"""OpenCL GEMM on tensor cores with FP32 accuracy (3xTF32): NVIDIA's OpenCL compiler accepts inline PTX, so
each warp runs `mma.sync.aligned.m16n8k8` on TF32 fragments it loads from local memory.

3xTF32: every FP32 operand x splits into a TF32 `big = rna(x)` and a residual `small = x - big` (which the tensor
core reads as TF32, i.e. truncated); the product accumulates small*big + big*small + big*big, which keeps the
error of a plain FP32 GEMM (a single TF32 product would lose about 10 bits). The tensor core adds its products into
the accumulator it is given by truncation, which over a long K drifts an order of magnitude past FP32's error, so
the products of KS k8 steps start from zero and then join the running sum with an ordinary (round-to-nearest) FP32
add. Global loads of the next K tile go to registers while the warps compute on the current one, and land in the
second of two local buffers (one barrier per tile). For an implicit-convolution spec (`GemmSpec.conv`) the B tile
is gathered from the image through the window as it loads (no im2col buffer); each K tile's window taps (channel,
row and column shift of each k) come from a small table in local memory that BK work-items fill a tile ahead, so
a gathered element costs one broadcast local read and a bounds check instead of two divisions by constants.

Knobs: BM x BN block tile, BK K tile, WM x WN per warp, WK warp groups splitting each K tile (few-tile products),
KS k8 steps per FP32 add, FOLD=1 to run a batch of products sharing A as one product with the batch along the
columns (late convolution layers, whose per-image width of 49 or 196 would waste most of a tile), GT=0 to gather
without the k-table, VG=1 to gather an implicit convolution's columns four per load (`_vector_conv`), MMA=0 for
the portable twin.

The same template has a portable twin (knob MMA=0, kernel kind GEMM3XTF32EMU) that computes each lane's
accumulator elements of the same fragments with ordinary FMAs and an exact emulation of TF32 rounding, so the
tiling, pipelining, bounds and epilogue run (and are tested) on any OpenCL device, PoCL on a CPU included. The
PTX path (kind GEMM3XTF32) is used only where `mma_tf32_unsupported` found the instruction working; asking for
it elsewhere raises instead of quietly running something else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from plait.codegen.cstyle import RenderedKernel
from plait.codegen.gemm import (
    Epilogue,
    GemmSpec,
    _cl_operands,
    _epi,
    _finish,
    conv_column,
    conv_gather,
    conv_t_gather,
    conv_wide,
    nchw_a_at,
)
from plait.errors import DeviceError, UnsupportedError

TC_DEFAULT = {"V": 3, "MMA": 1, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 32, "KS": 1, "GT": 1, "VG": 0}

# TF32 rounding by integer ops (round to nearest, ties away, 10 mantissa bits: what cvt.rna.tf32 computes, but at
# integer rate, where conversions run at a quarter of it). The residual goes to the tensor core unrounded: it reads
# the top 19 bits of each operand register. The portable twin truncates it the same way.
_TF32 = """//@shared-begin plait_tf32
inline float plait_tf32(float x) { return as_float((as_uint(x) + 0x1000u) & 0xffffe000u); }
//@shared-end
"""
_PTX_HELPERS = (
    _TF32
    + """//@shared-begin plait_mma_tf32
inline float plait_tf32_residual(float x, float big) { return x - big; }
inline void plait_mma_tf32(float* c, float a0, float a1, float a2, float a3, float b0, float b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(as_uint(a0)), "r"(as_uint(a1)), "r"(as_uint(a2)), "r"(as_uint(a3)), "r"(as_uint(b0)),
                 "r"(as_uint(b1)));
}
inline void plait_mma_tf32_first(float* d, float a0, float a1, float a2, float a3, float b0, float b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%10,%10,%10,%10};"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(as_uint(a0)), "r"(as_uint(a1)), "r"(as_uint(a2)), "r"(as_uint(a3)), "r"(as_uint(b0)),
                 "r"(as_uint(b1)), "f"(0.0f));
}
//@shared-end
"""
)
_EMU_HELPERS = (
    _TF32
    + """//@shared-begin plait_tf32_emu
inline float plait_tf32_residual(float x, float big) { return as_float(as_uint(x - big) & 0xffffe000u); }
//@shared-end
"""
)

_PROBE = (
    _PTX_HELPERS
    + """__kernel void plait_mma_probe(__global float* c, __global const float* a, __global const float* b) {
  int lane = get_local_id(0), g = lane >> 2, t = lane & 3;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  plait_mma_tf32(acc, a[g * 8 + t], a[(g + 8) * 8 + t], a[g * 8 + t + 4], a[(g + 8) * 8 + t + 4], b[t * 8 + g],
                 b[(t + 4) * 8 + g]);
  for (int r = 0; r < 4; r++) c[(g + (r >> 1) * 8) * 8 + 2 * t + (r & 1)] = acc[r];
}
"""
)

_probed: dict[tuple[str, str, str], str | None] = {}


def mma_tf32_unsupported(device: Any) -> str | None:
    """None when `device` runs the inline-PTX tensor-core product correctly, else the reason it cannot.

    The probe builds a one-warp kernel with `asm volatile("mma.sync...")` and checks a 16x8x8 product of small
    integers (exact in TF32) against NumPy, which also checks the fragment layouts the GEMM template relies on.
    """
    key = (device.name, device.info.name, device.info.driver)
    if key in _probed:
        return _probed[key]
    why: str | None = None
    if device.renderer.dialect != "opencl":
        why = f"{device.name} is not an OpenCL device"
    elif not device.info.extra.get("gpu"):
        why = f"{device.name} ({device.info.name}) is not a GPU, so it has no tensor cores"
    else:
        why = run_probe(device)
    _probed[key] = why
    return why


def run_probe(device: Any) -> str | None:
    rng = np.random.default_rng(0)
    a = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    b = rng.integers(-8, 9, (8, 8)).astype(np.float32)
    alloc = device.allocator
    bufs = [alloc.alloc(16 * 8 * 4), alloc.alloc(a.nbytes), alloc.alloc(b.nbytes)]
    try:
        alloc.copy_in(bufs[1], a)
        alloc.copy_in(bufs[2], b)
        device.compile(_PROBE, "plait_mma_probe").bind(bufs, (32,), (32,))()
        got = np.empty((16, 8), np.float32)
        alloc.copy_out(bufs[0], got)
    except Exception as e:  # a compiler without inline PTX, or a GPU without the instruction
        return f"the mma.sync probe kernel failed to build or run on {device.name}: {' '.join(str(e).split())[:300]}"
    finally:
        for buf in bufs:
            alloc.free(buf.nbytes, buf.handle)
    if not np.array_equal(got, a @ b):
        return f"the mma.sync probe kernel computed wrong values on {device.name}"
    return None


def check_device(device: Any, knobs: dict[str, int]) -> None:
    """Raise when `knobs` ask for the PTX tensor-core path on a device where the probe failed, or for tiles whose
    two local buffers do not fit the device's local memory."""
    if knobs.get("V") != 3:
        return
    if knobs.get("MMA", 1):
        why = mma_tf32_unsupported(device)
        if why:
            raise DeviceError(
                f"GEMM knobs {knobs} ask for tensor cores (3xTF32 mma.sync) but {why}; use knobs with MMA=0 "
                "(the portable twin) or another GEMM variant, or clear the tuning cache"
            )
    need, have = local_bytes(knobs), device.info.extra.get("local_mem", 0)
    if have and need > have:
        raise DeviceError(
            f"GEMM knobs {knobs} need {need} bytes of local memory but {device.name} has {have}; use smaller BM, BN "
            "or BK"
        )


class _Operand:
    """How one operand tile (rows x BK) moves from global to local memory and where a fragment element sits.

    `kmajor` (contiguous along K in memory) keeps the local tile as [row][BK + 4]; otherwise [k][rows + 8]. Both
    paddings make a warp's fragment loads (8 rows x 4 k per register) hit 32 different banks."""

    def __init__(
        self,
        name: str,
        rows: int,
        size: int,
        bk: int,
        sr: int,
        sk: int,
        aligned: bool,
        nt: int,
        row: str = "",
        gather: Callable[[str, str, str, str], tuple[str, str]] | None = None,
        table: bool = False,
    ):
        self.name, self.rows, self.size, self.bk = name, rows, size, bk
        self.gather = gather  # (row, k0, k, condition) -> (declarations, value): an implicit convolution's B
        self.table = table  # the gather reads its k positions from a table that also zeroes k >= K
        self.sr, self.sk = sr, sk
        self.row = row or f"(long)(ROW) * {sr}"  # address of row ROW (its k = 0 element)
        self.kmajor = sk == 1
        self.stride = bk + 4 if self.kmajor else rows + 8
        contiguous = sk == 1 or sr == 1
        self.vec = 4 if contiguous and aligned and (bk if self.kmajor else rows) % 4 == 0 else 1
        self.total = rows * bk // self.vec
        self.loads = -(-self.total // nt)
        self.exact = self.total % nt == 0
        self.nt = nt

    @property
    def local_floats(self) -> int:
        return self.rows * self.stride if self.kmajor else self.bk * self.stride

    def at(self, r: str, k: str) -> str:
        return f"({r}) * {self.stride} + ({k})" if self.kmajor else f"({k}) * {self.stride} + ({r})"

    def _coords(self, i: int) -> str:
        per = (self.bk if self.kmajor else self.rows) // self.vec
        outer, inner = ("r", "k") if self.kmajor else ("k", "r")
        scale = f" * {self.vec}" if self.vec > 1 else ""
        if self.nt % per == 0:  # every load of a thread at the same inner position: its gather work is shared
            return f"int {outer} = tid / {per} + {i * self.nt // per}, {inner} = tid % {per}{scale};"
        return f"int l = tid + {i * self.nt}, {outer} = l / {per}, {inner} = l % {per}{scale};"

    def fetch(self, r0: str, k0: str, full_r: bool, full_k: bool) -> str:
        """Statements loading this thread's share of the tile at (r0, k0) into registers x_reg[]."""
        x = self.name.lower()
        lines = []
        for i in range(self.loads):
            guard = "" if self.exact or i < self.loads - 1 else f"if (tid + {i * self.nt} < {self.total}) "
            conds = [] if full_r else [f"{r0} + r < {self.size}"]
            if not full_k and not self.table:
                conds.append(f"{k0} + k < K_")
            if self.gather is not None:
                decls, value = self.gather(f"{r0} + r", k0, "k", " && ".join(conds) or "1")
                lines.append(f"    {guard}{{ {self._coords(i)} {decls} {x}_reg[{i}] = {value}; }}")
                continue
            addr = f"{self.row.replace('ROW', f'{r0} + r')} + (long)({k0} + k) * {self.sk}"
            load = f"vload4(0, {x} + {addr})" if self.vec == 4 else f"{x}[{addr}]"
            zero = "(float4)(0.0f)" if self.vec == 4 else "0.0f"
            val = f"({' && '.join(conds)}) ? {load} : {zero}" if conds else load
            lines.append(f"    {guard}{{ {self._coords(i)} {x}_reg[{i}] = {val}; }}")
        return "\n".join(lines) + "\n"

    def store(self, buf: str) -> str:
        """Statements storing the registers into local buffer `buf`."""
        x = self.name.lower()
        lines = []
        for i in range(self.loads):
            guard = "" if self.exact or i < self.loads - 1 else f"if (tid + {i * self.nt} < {self.total}) "
            if self.vec == 4:
                st = f"vstore4({x}_reg[{i}], 0, {buf} + {self.at('r', 'k')});"
            else:
                st = f"{buf}[{self.at('r', 'k')}] = {x}_reg[{i}];"
            lines.append(f"    {guard}{{ {self._coords(i)} {st} }}")
        return "\n".join(lines) + "\n"

    def regs(self) -> str:
        t = "float4" if self.vec == 4 else "float"
        return f"  {t} {self.name.lower()}_reg[{self.loads}];\n"


def _aligned(spec: GemmSpec, which: str) -> bool:
    """True when every float4 this operand's tile loads starts on a 16-byte boundary."""
    if which == "a":
        off, sb, sr, sk = spec.a
        si, rows = spec.a_inner, spec.m
    else:
        off, sb, sk, sr = spec.b
        si, rows = spec.b_inner, spec.n
    inner_extent = spec.k if sk == 1 else rows
    other = sr if sk == 1 else sk
    return all(v % 4 == 0 for v in (off, sb, si, other, inner_extent))


def _mma_step(mi: int, ni: int, ks: int, emu: bool, a: _Operand, b: _Operand) -> str:
    """`ks` k8 steps of the warp tile at kk: fragments from local memory (As/Bs), split, three products per step
    chained in the tensor core from zero, then one round-to-nearest FP32 add into the running sum."""
    if emu:
        return f"""      for (int mi = 0; mi < {mi}; mi++)
        for (int ni = 0; ni < {ni}; ni++)
          for (int r = 0; r < 4; r++) {{
            int row = wr + mi * 16 + g + (r >> 1) * 8, col = wc + ni * 8 + 2 * t + (r & 1);
            float s = 0.0f;
            for (int q = 0; q < {8 * ks}; q++) {{
              float x = As[{a.at("row", "kk + q")}], y = Bs[{b.at("col", "kk + q")}];
              float xb = plait_tf32(x), yb = plait_tf32(y);
              float xs = plait_tf32_residual(x, xb), ys = plait_tf32_residual(y, yb);
              s = fma(xs, yb, s);
              s = fma(xb, ys, s);
              s = fma(xb, yb, s);
            }}
            acc[mi][ni][r] += s;
          }}
"""
    big_a, small_a = (
        "abig[s][mi][0], abig[s][mi][1], abig[s][mi][2], abig[s][mi][3]",
        "asml[s][mi][0], asml[s][mi][1], asml[s][mi][2], asml[s][mi][3]",
    )
    big_b, small_b = "bbig[s][ni][0], bbig[s][ni][1]", "bsml[s][ni][0], bsml[s][ni][1]"
    return f"""      float abig[{ks}][{mi}][4], asml[{ks}][{mi}][4], bbig[{ks}][{ni}][2], bsml[{ks}][{ni}][2];
#pragma unroll
      for (int s = 0; s < {ks}; s++)
#pragma unroll
        for (int mi = 0; mi < {mi}; mi++)
#pragma unroll
          for (int j = 0; j < 4; j++) {{
            float x = As[{a.at("wr + mi * 16 + g + (j & 1) * 8", "kk + s * 8 + t + (j >> 1) * 4")}];
            abig[s][mi][j] = plait_tf32(x);
            asml[s][mi][j] = plait_tf32_residual(x, abig[s][mi][j]);
          }}
#pragma unroll
      for (int s = 0; s < {ks}; s++)
#pragma unroll
        for (int ni = 0; ni < {ni}; ni++)
#pragma unroll
          for (int j = 0; j < 2; j++) {{
            float y = Bs[{b.at("wc + ni * 8 + g", "kk + s * 8 + t + j * 4")}];
            bbig[s][ni][j] = plait_tf32(y);
            bsml[s][ni][j] = plait_tf32_residual(y, bbig[s][ni][j]);
          }}
#pragma unroll
      for (int mi = 0; mi < {mi}; mi++)
#pragma unroll
        for (int ni = 0; ni < {ni}; ni++) {{
          float d[4];
          const int s = 0;
          plait_mma_tf32_first(d, {small_a}, {big_b});
          plait_mma_tf32(d, {big_a}, {small_b});
          plait_mma_tf32(d, {big_a}, {big_b});
#pragma unroll
          for (int s = 1; s < {ks}; s++) {{
            plait_mma_tf32(d, {small_a}, {big_b});
            plait_mma_tf32(d, {big_a}, {small_b});
            plait_mma_tf32(d, {big_a}, {big_b});
          }}
          for (int q = 0; q < 4; q++) acc[mi][ni][q] += d[q];
        }}
"""


def check_knobs(kn: dict[str, int]) -> None:
    """Raise a clear error for a tile shape the template cannot run (warp tiles in 16x8 fragments)."""
    bm, bn, bk, wm, wn = kn["BM"], kn["BN"], kn["BK"], kn["WM"], kn["WN"]
    ok = bm % wm == 0 and bn % wn == 0 and wm % 16 == 0 and wn % 8 == 0
    ok = ok and bk % (8 * kn.get("KS", 1) * kn.get("WK", 1)) == 0
    if not ok:
        raise UnsupportedError(
            f"3xTF32 GEMM knobs {kn}: need BM % WM == BN % WN == 0, WM % 16 == WN % 8 == BK % (8 * KS * WK) == 0"
        )


# a k past K reads its window this far below the image, so the table's bounds check also zeroes it
_FAR = 1 << 14


def _table_fits(spec: GemmSpec) -> bool:
    """True when the k-table's packed offsets (16 bits each way, _FAR for k >= K) hold this window."""
    win = spec.conv
    assert win is not None
    reach = max(win.h + win.ph, win.w + win.pw, (win.kh - 1) * win.dh + 1, (win.kw - 1) * win.dw + 1)
    return reach < _FAR // 2 and not conv_wide(spec)


def _table_fill(spec: GemmSpec, bk: int, slot: str, k0: str) -> str:
    """Statements filling k-table `slot` for the K tile at `k0`: per k, the image offset of its window tap
    (channel plane, row, column) and its (row, column) shift packed in 16 bits each. The k decomposition (two
    divisions by constants) then runs once per tile per k instead of once per gathered element."""
    win = spec.conv
    assert win is not None
    taps, far = win.kh * win.kw, _FAR << 16 | _FAR
    return f"""    if (tid < {bk}) {{
      const int p_ = {k0} + tid, t_ = p_ % {taps}, dy_ = t_ / {win.kw} * {win.dh}, dx_ = t_ % {win.kw} * {win.dw};
      ktab_[{slot}][tid] = p_ < {spec.k} ? (int2)(p_ / {taps} * {win.h * win.w} + dy_ * {win.w} + dx_, dy_ << 16 | dx_)
                                       : (int2)(0, {far});
    }}
"""


def _table_entry(spec: GemmSpec, row: str, fold: bool, k: str) -> str:
    """Declarations shared by the k-table gathers: the column's placement (`conv_column`), the entry `e_` of tap `k`
    and the input pixel (iy_, ix_) it reads."""
    return (
        f"{conv_column(spec, row, fold)} const int2 e_ = ktab[{k}];"
        " const int iy_ = iy0_ + (e_.y >> 16), ix_ = ix0_ + (e_.y & 0xffff);"
    )


def _table_gather(spec: GemmSpec, fold: bool) -> Callable[[str, str, str, str], tuple[str, str]]:
    """An implicit convolution's B element through the k-table `ktab` of the current tile (see `_table_fill`)."""
    win = spec.conv
    assert win is not None

    def gather(row: str, k0: str, k: str, cond: str) -> tuple[str, str]:
        decls = _table_entry(spec, row, fold, k)
        inside = f"(uint)iy_ < {win.h}u && (uint)ix_ < {win.w}u"
        return decls, f"({cond} && {inside}) ? b[o_ + iy0_ * {win.w} + ix0_ + e_.x] : 0.0f"

    return gather


def _vector_conv(spec: GemmSpec) -> bool:
    """True when an implicit convolution's B (k-table gather) can load four neighbouring columns at once: stride
    1 along the rows, output rows and the product's columns in whole fours (four aligned columns stay within one
    output row of one image and one batch entry), 32-bit offsets."""
    win = spec.conv
    assert win is not None
    return win.sw == 1 and win.ow % 4 == 0 and spec.n % 4 == 0 and _table_fits(spec)


def _table_gather4(spec: GemmSpec, fold: bool) -> Callable[[str, str, str, str], tuple[str, str]]:
    """`_table_gather` for four neighbouring columns (`_vector_conv`): one column placement, one k-table entry and
    one row bounds check serve four loads of neighbouring image columns, each still checked against the width."""
    win = spec.conv
    assert win is not None

    def gather(row: str, k0: str, k: str, cond: str) -> tuple[str, str]:
        decls = (
            _table_entry(spec, row, fold, k) + f" const bool in_ = ({cond}) && (uint)iy_ < {win.h}u;"
            f" __global const float* p_ = b + (o_ + iy0_ * {win.w} + ix0_ + e_.x);"
        )
        lanes = ", ".join(f"in_ && (uint)(ix_ + {j}) < {win.w}u ? p_[{j}] : 0.0f" for j in range(4))
        return decls, f"(float4)({lanes})"

    return gather


def _rows_fit(spec: GemmSpec) -> bool:
    """True when a `conv_t` spec's row table (`_rows_fill`) holds its window's shifts, as `_table_fits` says for
    the k-table."""
    win = spec.conv_t
    assert win is not None
    return max(win.h + win.ph, win.w + win.pw, (win.kh - 1) * win.dh + 1, (win.kw - 1) * win.dw + 1) < _FAR // 2


def _rows_fill(spec: GemmSpec, bn: int, nt: int) -> str:
    """Statements filling the row table of a `conv_t` spec (a weight gradient gathering the transposed patch
    columns) once per work-group: for each of the tile's BN columns, its (channel, kernel tap) as the image
    offset of the tap and its (row, column) shift packed in 16 bits each; columns past N shift far outside the
    image, so the gather's bounds check zeroes them. The K tile's loads then add a table entry to their k's
    window corner instead of dividing per element."""
    win = spec.conv_t
    assert win is not None
    taps, far = win.kh * win.kw, _FAR << 16 | _FAR
    return f"""  __local int2 rtab_[{bn}];
  for (int q = tid; q < {bn}; q += {nt}) {{
    const int row_ = row0_ + n0 + q, t_ = row_ % {taps}, dy_ = t_ / {win.kw} * {win.dh}, dx_ = t_ % {win.kw} * {win.dw};
    rtab_[q] = n0 + q < {spec.n} ? (int2)(row_ / {taps} * {win.h * win.w} + dy_ * {win.w} + dx_, dy_ << 16 | dx_)
                                 : (int2)(0, {far});
  }}
  barrier(CLK_LOCAL_MEM_FENCE);
"""


def _rows_gather(spec: GemmSpec) -> Callable[[str, str, str, str], tuple[str, str]]:
    """A `conv_t` spec's B element through the row table: the k's window corner (its image and output position:
    divisions by constants that a K tile's loads share, since a work-item keeps its k) plus the column's entry.
    A k past K moves the corner twice _FAR above the image (a column past N adds at most _FAR back)."""
    win = spec.conv_t
    assert win is not None
    plane = win.oh * win.ow

    def gather(row: str, k0: str, k: str, cond: str) -> tuple[str, str]:
        decls = (
            f"const int pk_ = pos0_ + {k0} + {k}, pp_ = pk_ % {plane};"
            f" const int iy0_ = {k0} + {k} < K_ ? pp_ / {win.ow} * {win.sh} - {win.ph} : {-2 * _FAR},"
            f" ix0_ = pp_ % {win.ow} * {win.sw} - {win.pw};"
            f" const int2 e_ = rtab_[({row}) - n0]; const int iy_ = iy0_ + (e_.y >> 16), ix_ = ix0_ + (e_.y & 0xffff);"
        )
        at = f"pk_ / {plane} * {win.c * win.h * win.w} + iy0_ * {win.w} + ix0_ + e_.x"
        return decls, f"({cond} && (uint)iy_ < {win.h}u && (uint)ix_ < {win.w}u) ? b[{at}] : 0.0f"

    return gather


def _a_operand(spec: GemmSpec, bm: int, bk: int, nt: int) -> _Operand:
    """A's tile loader: a strided view, or (`a_nchw`) the output gradient read in place from its NCHW buffer, one
    float per load (a K tile's run may cross an image's plane)."""
    _, _, sam, sak = spec.a
    if spec.a_nchw is None:
        return _Operand("A", bm, spec.m, bk, sam, sak, _aligned(spec, "a"), nt)

    def gather(row: str, k0: str, k: str, cond: str) -> tuple[str, str]:
        return "", f"({cond}) ? a[{nchw_a_at(spec, row, f'{k0} + {k}')}] : 0.0f"

    return _Operand("A", bm, spec.m, bk, sam, sak, False, nt, gather=gather)


def _b_operand(
    spec: GemmSpec, bn: int, bk: int, nt: int, fold: bool, table: bool = False, vector: bool = False
) -> tuple[_Operand, str]:
    """B's tile loader and the linear index of output element (gm, gn) in C. With `fold` the batch runs along
    the columns: column gn of the one wide product is column gn % n of batch gn / n. With `table` an implicit
    convolution gathers through the per-tile k-table, with `vector` four columns per load where `_vector_conv`
    allows."""
    m, n = spec.m, spec.n
    _, sbb, sbk, sbn = spec.b
    if spec.conv_t is not None:
        if fold:
            raise UnsupportedError(f"3xTF32 GEMM {spec}: FOLD=1 cannot run a weight gradient gathered from the image")
        rows = _rows_fit(spec)
        if rows:
            gather_t = _rows_gather(spec)
        else:

            def gather_t(row: str, k0: str, k: str, cond: str) -> tuple[str, str]:
                return conv_t_gather(spec, f"{k0} + {k}", row, cond)

        # K-major like the column buffer it replaces ([row][BK + 4] tiles), one gathered float per load
        b = _Operand("B", bn, n, bk, sbn, 1, False, nt, gather=gather_t, table=rows)
        return b, f"bz * {m * n}L + (long)gm * {n} + gn"
    gather = None
    four = spec.conv is not None and table and vector and _vector_conv(spec)
    if four:
        gather = _table_gather4(spec, fold)
    elif spec.conv is not None:
        if table:
            gather = _table_gather(spec, fold)
        else:

            def gather(row: str, k0: str, k: str, cond: str) -> tuple[str, str]:
                return conv_gather(spec, f"{k0} + {k}", row, cond, fold)

    # four gathered columns per load: a [k][column] tile read as if contiguous along the columns
    gsr, gsk, galigned = (1, 0, True) if four else (0, 0, False)
    if not fold:
        sr, sk, aligned = (gsr, gsk, galigned) if four else (sbn, sbk, _aligned(spec, "b"))
        b = _Operand("B", bn, n, bk, sr, sk, aligned, nt, gather=gather, table=table)
        return b, f"bz * {m * n}L + (long)gm * {n} + gn"
    if spec.a[1] or spec.a_inner:
        raise UnsupportedError(f"3xTF32 GEMM {spec}: FOLD=1 needs an A shared by every batch (batch stride 0)")
    if gather is not None:
        b = _Operand("B", bn, spec.batch * n, bk, gsr, gsk, galigned, nt, gather=gather, table=table)
        return b, f"(long)(gn / {n}) * {m * n} + (long)gm * {n} + gn % {n}"
    img, col = f"(long)((ROW) / {n})", f"(long)((ROW) % {n})"
    inner = spec.inner
    batch_off = f"{img} * {sbb}" if inner == 1 else f"{img} / {inner} * {sbb} + {img} % {inner} * {spec.b_inner}"
    b = _Operand("B", bn, spec.batch * n, bk, sbn, sbk, _aligned(spec, "b"), nt, f"{batch_off} + {col} * {sbn}")
    return b, f"(long)(gn / {n}) * {m * n} + (long)gm * {n} + gn % {n}"


def _reduce_warps(wk: int, warps: int, mi: int, ni: int) -> str:
    """With WK warps along K, warps wk > 0 hand their sums to warp group 0 through local memory."""
    if wk == 1:
        return ""
    per = mi * ni * 4 * 32

    def slot(group: str) -> str:
        return f"red[(({group} - 1) * {warps} + w2) * {per} + ((i * {ni} + j) * 4 + q) * 32 + lane]"

    loops = f"for (int i = 0; i < {mi}; i++) for (int j = 0; j < {ni}; j++) for (int q = 0; q < 4; q++)"
    return f"""  __local float red[{(wk - 1) * warps * per}];
  if (wk > 0)
    {loops} {slot("wk")} = acc[i][j][q];
  barrier(CLK_LOCAL_MEM_FENCE);
  if (wk == 0)
    for (int h = 1; h < {wk}; h++)
      {loops} acc[i][j][q] += {slot("h")};
"""


def render(spec: GemmSpec, knobs: dict[str, int], r: Any = None, epi: Epilogue | None = None) -> RenderedKernel:
    """The 3xTF32 GEMM for `spec`: block tile BM x BN, K tile BK, one warp per WM x WN sub-tile, WK warps
    splitting each K tile (their sums meet in local memory)."""
    kn = {**TC_DEFAULT, **knobs}
    check_knobs(kn)
    bm, bn, bk, wm, wn, ks, emu = kn["BM"], kn["BN"], kn["BK"], kn["WM"], kn["WN"], kn["KS"], not kn["MMA"]
    wk = kn.get("WK", 1)
    warps_n, warps = bn // wn, (bm // wm) * (bn // wn)
    nt = wk * warps * 32
    m, k = spec.m, spec.k
    a = _a_operand(spec, bm, bk, nt)
    fold = bool(kn.get("FOLD"))
    table = spec.conv is not None and bool(kn["GT"]) and _table_fits(spec)
    b, c_at = _b_operand(spec, bn, bk, nt, fold, table, bool(kn["VG"]))
    full_m, full_n, full_k = m % bm == 0, b.size % bn == 0, k % bk == 0
    mi, ni = wm // 16, wn // 8
    stmts, res, params = _epi(r, epi, "acc[mi][ni][q]", c_at, "          ")
    kt, kw = -(-k // bk), bk // wk
    # with a k-table, tile kt + 2's table is filled while tile kt + 1 is in flight (two slots, one barrier apart)
    tab_decl, tab_first, tab_next, tab_cur = "", "", "", ""
    if table:
        tab_decl = f"  __local int2 ktab_[2][{bk}];\n"
        tab_first = (
            f"{_table_fill(spec, bk, '0', '0')}{_table_fill(spec, bk, '1', str(bk))}  barrier(CLK_LOCAL_MEM_FENCE);\n"
        )
        tab_next = f"    if (kt + 2 < {kt}) {{\n{_table_fill(spec, bk, 'kt & 1', f'(kt + 2) * {bk}')}    }}\n"
        tab_cur = "    __local const int2* ktab = ktab_[{}];\n"
    rows_first = _rows_fill(spec, bn, nt) if spec.conv_t is not None and b.table else ""
    src = f"""/* KERNEL_NAME */
{_EMU_HELPERS if emu else _PTX_HELPERS}#define K_ {k}
__kernel __attribute__((reqd_work_group_size({nt}, 1, 1))) void KERNEL_NAME(__global float* restrict C, __global const float* restrict A, __global const float* restrict B{params}) {{
  const int tid = get_local_id(0), lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int wk = warp / {warps}, w2 = warp % {warps}, wr = w2 / {warps_n} * {wm}, wc = w2 % {warps_n} * {wn};
  const int n0 = get_group_id(0) * {bn}, m0 = get_group_id(1) * {bm};
  const long bz = get_group_id(2);
{_cl_operands(spec)}  __local float As_[2][{a.local_floats}], Bs_[2][{b.local_floats}];
{tab_decl}  float acc[{mi}][{ni}][4];
  for (int i = 0; i < {mi}; i++) for (int j = 0; j < {ni}; j++) for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;
{a.regs()}{b.regs()}{tab_first}{rows_first}  {{
    const int k0 = 0;
{tab_cur.format("0")}{a.fetch("m0", "k0", full_m, full_k)}{b.fetch("n0", "k0", full_n, full_k)}{a.store("As_[0]")}{b.store("Bs_[0]")}  }}
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int kt = 0; kt < {kt}; kt++) {{
    const int cur = kt & 1, k0 = (kt + 1) * {bk};
    if (kt + 1 < {kt}) {{
{tab_cur.format("cur ^ 1")}{a.fetch("m0", "k0", full_m, full_k)}{b.fetch("n0", "k0", full_n, full_k)}    }}
    __local const float* As = As_[cur];
    __local const float* Bs = Bs_[cur];
#pragma unroll
    for (int kk = wk * {kw}; kk < wk * {kw} + {kw}; kk += {8 * ks}) {{
{_mma_step(mi, ni, ks, emu, a, b)}    }}
    if (kt + 1 < {kt}) {{
{a.store("As_[cur ^ 1]")}{b.store("Bs_[cur ^ 1]")}    }}
{tab_next}    barrier(CLK_LOCAL_MEM_FENCE);
  }}
{_reduce_warps(wk, warps, mi, ni)}  if (wk == 0)
    for (int mi = 0; mi < {mi}; mi++)
      for (int ni = 0; ni < {ni}; ni++)
        for (int q = 0; q < 4; q++) {{
          const int gm = m0 + wr + mi * 16 + g + (q >> 1) * 8, gn = n0 + wc + ni * 8 + 2 * t + (q & 1);
          if (gm < {m} && gn < {b.size}) {{
{stmts}            C[{c_at}] = {res};
          }}
        }}
}}
#undef K_
"""
    gs = (-(-b.size // bn) * nt, -(-m // bm), 1 if fold else spec.batch)
    return _finish("GEMM3XTF32EMU" if emu else "GEMM3XTF32", spec, src, gs, (nt, 1, 1))


def local_bytes(knobs: dict[str, int]) -> int:
    """Local memory one work-group of this configuration uses at most (two buffers per operand, the larger of
    the two layouts each, and a convolution's two k-table slots)."""
    kn = {**TC_DEFAULT, **knobs}
    bm, bn, bk = kn["BM"], kn["BN"], kn["BK"]
    per_operand = [max(rows * (bk + 4), bk * (rows + 8)) for rows in (bm, bn)]
    tables = 2 * 8 * bk + 8 * bn  # a convolution's k-table, a weight gradient's row table
    return 2 * 4 * sum(per_operand) + 4 * (kn.get("WK", 1) - 1) * bm * bn + tables
