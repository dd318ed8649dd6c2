"""The OpenCL C dialect (1.2): one work-item per output element; half through vload_half/vstore_half."""

from __future__ import annotations

from plait import dtypes
from plait.codegen.cstyle import CStyleRenderer, RenderedKernel
from plait.codegen.expr import ExprBuilder, Idx
from plait.dtypes import DType
from plait.graph.node import Node


class OpenCLRenderer(CStyleRenderer):
    dialect = "opencl"
    storage_types = {"float32": "float", "float16": "half", "int32": "int", "int64": "long", "bool": "uchar"}
    interleaved_split = True
    helper_qualifier = "inline"
    local_size = 256
    group_ids = ("get_group_id(0)", "get_local_id(0)")
    local_prefix = "__local"
    barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
    implicit_conv = True  # every OpenCL GEMM kernel gathers convolution patches from the image (no im2col buffer)
    conv_span = True  # ... also for columns with the batch folded in (gemm.conv_column finds each one's image)
    split_k = True  # few-tile products (batch-1 late layers) split K over more work-groups (scheduler._split_k)
    preamble = (
        "inline float plait_round_half(float x) { ushort h; vstore_half(x, 0, (half*)&h);"
        " return vload_half(0, (const half*)&h); }\n"
    )

    def round_half(self, v: str) -> str:
        return f"plait_round_half({v})"

    def load(self, dt: DType, buf: str, off: str) -> str:
        if dt == dtypes.float16:
            return f"vload_half({off}, {buf})"
        return super().load(dt, buf, off)

    def store(self, dt: DType, buf: str, off: str, val: str) -> str:
        if dt == dtypes.float16:
            return f"vstore_half({val}, {off}, {buf});"
        return super().store(dt, buf, off, val)

    def render_elementwise(self, out: Node, root: Node, inputs: list[Node]) -> RenderedKernel:
        """An elementwise kernel; one that reads a split-K chunk sum (scheduler._chunk_sums_inline) adds the chunks
        itself at its own index, in the chunk sum's order, and applies its expression to that sum."""
        sums = _chunk_sums(root, {n.uid for n in inputs})
        if not sums:
            return super().render_elementwise(out, root, inputs)
        params, args = self._params(out, inputs)
        idx_t = self.idx_type(out.size, *(n.size for n in inputs))
        b = ExprBuilder(self, args, idx_t)
        for m in sums:
            src = m.srcs[0]
            terms = [
                self.load(src.dtype, args[src.uid], f"gid + {c * m.size}" if c else "gid") for c in range(src.shape[0])
            ]
            b.subst[m.uid] = b.tmp(self.compute_type(m.dtype), " + ".join(terms), "s")
        v = b.value(root, Idx(root.shape, linear="gid"))
        b.lines.append(self.store(out.dtype, "b0", "gid", v))
        lines, gs, ls = self.parallel_for("gid", out.size, b.lines, idx_t, out.size * len(b.lines))
        return self._finish("E", out, params, lines, gs, ls)

    def render_elementwise_group(self, out: Node, writes: list[Node], inputs: list[Node]) -> RenderedKernel:
        """Merged elementwise outputs (scheduler._merge_final_writes); members of different sizes run one work-item
        per value of their concatenation, each range computing its own member at its own index."""
        members = [out, *writes]
        if len({m.size for m in members}) == 1:
            return super().render_elementwise_group(out, writes, inputs)
        params, names = self._params(out, inputs)
        for i, w in enumerate(writes, 1):
            params[i] = self.param(w.dtype, f"b{i}", True)
        total = sum(m.size for m in members)
        idx_t = self.idx_type(total, *(n.size for n in inputs))
        reads = {k: v for k, v in names.items() if k not in {w.uid for w in writes}}
        lines, lo = [], 0
        for name, node in [("b0", out), *((names[w.uid], w) for w in writes)]:
            b = ExprBuilder(self, reads, idx_t)
            v = b.value(node, Idx(node.shape, linear="j"))
            lines.append(f"{'else ' if lo else ''}if (gid < {lo + node.size}) {{")
            lines += [
                f"  {idx_t} j = gid - {lo};",
                *(f"  {ln}" for ln in b.lines),
                "  " + self.store(node.dtype, name, "j", v),
            ]
            lines.append("}")
            lo += node.size
        body, gs, ls = self.parallel_for("gid", total, lines, idx_t, total)
        k = self._finish("E", out, params, body, gs, ls)
        k.writes = len(members)
        return k

    def param(self, dt: DType, name: str, is_output: bool) -> str:
        const = "" if is_output else "const "
        return f"__global {const}{self.storage_type(dt)}* restrict {name}"

    def declare(self, name: str, params: list[str]) -> str:
        return f"__kernel void {name}({', '.join(params)})"

    def parallel_for(
        self, var: str, n: int, body: list[str], idx_t: str, work: int, simd_ok: bool = False
    ) -> tuple[list[str], tuple[int, ...], tuple[int, ...] | None]:
        ls = min(self.local_size, max(1, n))
        gs = -(-n // ls) * ls
        head = [f"{idx_t} {var} = get_global_id(0);"]
        if gs != n:
            head.append(f"if ({var} >= {n}) return;")
        return [*head, *body], (gs,), (ls,)


def _chunk_sums(root: Node, names: set[int]) -> list[Node]:
    """The sums over axis 0 of a buffer argument's chunks inside root's expression (it stops at the arguments)."""
    found: list[Node] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n.uid in seen or n.uid in names:
            continue
        seen.add(n.uid)
        if n.op == "rsum" and n.arg == (0,) and n.srcs[0].uid in names and n.srcs[0].shape[1:] == n.shape[1:]:
            found.append(n)
            continue
        stack.extend(n.srcs)
    return found
