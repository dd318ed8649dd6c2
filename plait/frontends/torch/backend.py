"""The "plait" dynamo backend: AOTAutograd turns the dynamo graph into forward and backward ATen graphs
(core-ATen decompositions for ops without a direct lowering); each is cut into plait partitions and PyTorch rest."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from plait.errors import PlaitError
from plait.frontends.torch.lowering import LOWERINGS
from plait.frontends.torch.partition import (
    BY_DESIGN,
    PREFIX,
    PlaitFallbackWarning,
    PlaitPartition,
    is_host_op,
    op_name,
    partition,
)
from plait.runtime import canonical, default_device

OPTIONS = ("device",)


def decompositions() -> dict[Any, Callable[..., Any]]:
    """Core-ATen decompositions, minus every op plait lowers directly (a direct lowering fuses better)."""
    return {op: fn for op, fn in core_aten_decompositions().items() if op not in LOWERINGS}


@dataclass
class GraphReport:
    """What happened to one AOTAutograd graph (forward, backward or inference)."""

    kind: str
    plait_ops: Counter[str]
    torch_ops: dict[str, str]  # op -> why it stayed in PyTorch
    partitions: list[PlaitPartition]

    @property
    def kernels(self) -> int:
        return sum(c.kernels for p in self.partitions for c in p.compiled.values() if c is not None)


@dataclass
class Session:
    """One backend call (one dynamo graph): its device, its graphs, and the ops already warned about."""

    device: str
    graphs: list[GraphReport] = field(default_factory=list)
    warned: set[str] = field(default_factory=set)

    def warn(self, ops: dict[str, str]) -> None:
        new = {k: v for k, v in ops.items() if k not in self.warned and k not in _BY_DESIGN_NAMES}
        if not new:
            return
        self.warned.update(new)
        listing = "; ".join(f"{k} ({v})" for k, v in sorted(new.items()))
        warnings.warn(
            f"plait: these ops run in PyTorch, not on {self.device}: {listing}. The rest of the graph runs in plait; "
            "plait.explain(model, *inputs) shows the split.",
            PlaitFallbackWarning,
            stacklevel=2,
        )

    def compile(self, gm: torch.fx.GraphModule, example_inputs: Any, kind: str) -> Callable[..., Any]:
        gm, left = partition(gm, self.device, self.warn)
        parts = [m for n, m in gm.named_children() if n.startswith(PREFIX) and isinstance(m, PlaitPartition)]
        ops: Counter[str] = Counter()
        for p in parts:
            ops.update(p.ops)
        self.graphs.append(GraphReport(kind, ops, left, parts))
        self.warn(left)
        for hook in _RECORDERS:
            hook(self)
        return make_boxed_func(gm.forward)


_BY_DESIGN_NAMES = {op_name(op) for op in BY_DESIGN}
_RECORDERS: list[Callable[[Session], None]] = []


def parse_options(options: dict[str, Any] | None) -> str:
    """The device named by options={"device": ...}, else PLAIT_DEVICE, else the fastest usable device."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise PlaitError(f"torch.compile(backend='plait'): unknown options {unknown}; the options are {list(OPTIONS)}")
    device = options.get("device")
    return canonical(device) if device else default_device()


def plait_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """Compile one dynamo graph: forward/backward/inference ATen graphs, each cut into plait partitions."""
    session = Session(parse_options(options))
    return aot_autograd(
        fw_compiler=lambda g, ex: session.compile(g, ex, "forward"),
        bw_compiler=lambda g, ex: session.compile(g, ex, "backward"),
        inference_compiler=lambda g, ex: session.compile(g, ex, "inference"),
        decompositions=decompositions(),
    )(gm, example_inputs)


__all__ = ["GraphReport", "PlaitFallbackWarning", "Session", "is_host_op", "plait_backend"]
