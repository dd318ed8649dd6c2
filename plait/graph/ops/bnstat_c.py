"""Training batch norm's per-channel statistics on the cpu as ops with C kernels of their own
(plait/codegen/bnstat_c.py): `bn_moments_c`, the forward's mean and biased variance from one read of the input, and
`bn_grad_sums_c`, the backward's sums of g and of g * (x - mean) from one read of each. Each has a (k, C) output, which
the cpu's reductions (one output per kernel) cannot make: as reductions they were two passes over the activation
each way. `plait.nn.functional.batch_norm` uses them for float32 (N, C, ...) inputs with spatial axes.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

from plait import dtypes
from plait.codegen import bnstat_c
from plait.codegen.c import entry_points
from plait.codegen.cstyle import RenderedKernel
from plait.errors import ShapeError, UnsupportedError
from plait.graph.node import Node
from plait.graph.ops import OpDef, register


def supports(x: Node) -> bool:
    """Whether the kernels take this activation: float32 on the cpu, (N, C, ...) with at least one spatial axis."""
    return x.dtype == dtypes.float32 and x.device.startswith("cpu") and len(x.shape) >= 3


def _layout(x: Node) -> tuple[Node, tuple[int, int, int, int, int]]:
    """(the node the kernel reads, (images, channels, positions, image stride, channel stride)). A folded
    convolution's output is NCHW seen through a permute of its (C, N, H, W) product: the kernel reads the product in
    place, each channel's planes one after another, instead of the scheduler copying it into NCHW first."""
    n, c = x.shape[:2]
    npos = math.prod(x.shape[2:])
    src = x.srcs[0] if x.op == "permute" and x.srcs else None
    if src is not None and len(x.shape) == 4 and x.arg == (1, 0, 2, 3) and src.shape == (c, n, *x.shape[2:]):
        return src, (n, c, npos, npos, n * npos)
    return x, (n, c, npos, c * npos, npos)


def bn_moments_c(x: Node, eps: float) -> Node:
    """(3, C): row 0 the mean, row 1 the biased variance, row 2 1 / sqrt(variance + `eps`) of each channel of `x`
    (N, C, ...). The last, computed here, reaches the normalisation's scale as a stored value."""
    if not supports(x):
        raise UnsupportedError(
            f"bn_moments_c {x.shape}: float32 (N, C, ...) with a spatial axis on the cpu device (got {x.dtype.name} "
            f"on {x.device}); plait.nn.functional.batch_norm takes channel sums elsewhere"
        )
    src, geo = _layout(x)
    return Node("bn_moments_c", (src,), (*geo, float(eps)), (3, x.shape[1]), x.dtype, x.device)


def bn_grad_sums_c(g: Node, x: Node, moments: Node) -> Node:
    """(2, C): row 0 the per-channel sums of `g`, row 1 those of `g` * (`x` - mean), both (N, C, ...), the mean
    row 0 of `moments` (`bn_moments_c` of `x`)."""
    if g.shape != x.shape or moments.shape != (3, x.shape[1] if len(x.shape) > 1 else 0):
        raise ShapeError(
            f"bn_grad_sums_c: gradient {g.shape}, input {x.shape} and statistics {moments.shape} do not match (need "
            f"the same (N, C, ...) shape and (3, C) statistics from bn_moments_c)"
        )
    if not (supports(g) and supports(x)):
        raise UnsupportedError(
            f"bn_grad_sums_c {g.shape}: float32 (N, C, ...) with a spatial axis on the cpu device (got "
            f"{g.dtype.name}/{x.dtype.name} on {g.device}); plait.nn.functional.batch_norm takes channel sums elsewhere"
        )
    src, geo = _layout(x)
    return Node("bn_grad_sums_c", (g, src, moments), geo, (2, x.shape[1]), g.dtype, g.device)


def _kernel(prefix: str, body: Any) -> Any:
    def render(r: Any, out: Node, inputs: list[Node]) -> RenderedKernel:
        if r.dialect != "c":
            raise UnsupportedError(f"{out.op} {out.shape}: this kernel runs on the cpu device only")
        params = [r.param(out.dtype, "b0", True), *(r.param(t.dtype, f"b{i + 1}", False) for i, t in enumerate(inputs))]
        src = entry_points("KERNEL_NAME", params, body(*out.arg), f"{bnstat_c.library()}/* KERNEL_NAME */\n")
        digest = hashlib.sha256(src.encode()).hexdigest()[:10]
        name = f"{prefix}_{out.arg[0]}x{out.arg[1]}x{out.arg[2]}_{digest}"
        return RenderedKernel(name, src.replace("KERNEL_NAME", name), (1,), None)

    return render


def _no_grad(node: Node, g: Node) -> tuple[Node | None, ...]:
    raise UnsupportedError(
        f"{node.op} {node.shape}: batch norm's statistics have no gradient of their own here; batch norm's backward "
        f"is its closed form (plait.nn.functional._batch_norm_vjp)"
    )


register(OpDef("bn_moments_c", "custom", _no_grad, kernel=_kernel("BNSTAT", bnstat_c.moments_call)))
register(OpDef("bn_grad_sums_c", "custom", _no_grad, kernel=_kernel("BNGRAD", bnstat_c.grad_sums_call)))
