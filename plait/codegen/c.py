"""The C dialect: one function per kernel, parallelised with OpenMP, vectorised by the compiler."""

from __future__ import annotations

from plait.codegen.cstyle import CStyleRenderer
from plait.dtypes import DType

_MATH = ("exp", "log", "sqrt", "fabs", "tanh", "sin", "cos", "erf", "floor", "ceil", "pow", "fmod")


class CRenderer(CStyleRenderer):
    dialect = "c"
    storage_types = {
        "float32": "float",
        "float16": "_Float16",
        "int32": "int",
        "int64": "long",
        "bool": "unsigned char",
    }
    fn_names = {f: f + "f" for f in _MATH}
    preamble = "#include <math.h>\n"
    parallel_threshold = 1 << 15  # below this much work, a parallel region costs more than it saves
    implicit_conv = True  # the C GEMM gathers convolution patches while packing (no im2col buffer)
    row_loops = True

    def round_half(self, v: str) -> str:
        return f"(float)(_Float16)({v})"

    def param(self, dt: DType, name: str, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"{const}{self.storage_type(dt)}* restrict {name}"

    def declare(self, name: str, params: list[str]) -> str:
        return f"void {name}({', '.join(params)})"

    def parallel_for(
        self, var: str, n: int, body: list[str], idx_t: str, work: int, simd_ok: bool = False
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        simd = " simd" if simd_ok else ""
        if work >= self.parallel_threshold and n > 1:
            pragma = [f"#pragma omp parallel for{simd} schedule(static)"]
        else:
            pragma = ["#pragma omp simd"] if simd else []
        return (
            [*pragma, f"for ({idx_t} {var} = 0; {var} < {n}; {var}++) {{", *("  " + ln for ln in body), "}"],
            (n,),
            None,
        )

    def parallel_rows(
        self, rows: int, width: int, head: list[str], body: list[str], idx_t: str, work: int, simd_ok: bool
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        outer = ["#pragma omp parallel for schedule(static)"] if work >= self.parallel_threshold and rows > 1 else []
        inner = ["#pragma omp simd"] if simd_ok else []
        lines = [
            *outer,
            f"for ({idx_t} o = 0; o < {rows}; o++) {{",
            *("  " + ln for ln in head),
            *("  " + ln for ln in inner),
            f"  for ({idx_t} j = 0; j < {width}; j++) {{",
            *("    " + ln for ln in body),
            "  }",
            "}",
        ]
        return lines, (rows * width,), None

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
        simd = {"sum": "+", "prod": "*", "max": "max", "min": "min"}.get(op)
        flag = " reduction(|:nanf)" if nan_flag else ""
        pragma = [f"#pragma omp simd reduction({simd}:{acc}){flag}"] if simd else []
        return [*pragma, *super().reduce_loop(var, lo, hi, step, body, idx_t, acc, op, nan_flag)]
