"""plait.explain: which ATen ops of a model run in plait, which stay in PyTorch (and why), how many kernels, and
with `kernels=True` the per-kernel report (time, GFLOP/s, GB/s, % of the device's peaks) of every plait partition.

>>> report = plait.explain(model, torch.randn(1, 3, 32, 32))   # doctest: +SKIP
>>> print(report)                                               # doctest: +SKIP
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from plait.frontends.torch.backend import _RECORDERS, GraphReport, Session, parse_options, plait_backend
from plait.schedule.profile import KernelReport, profile_plans


@dataclass
class Explanation:
    """The split of one compiled model: per AOTAutograd graph, the ops in plait and in PyTorch, and kernel counts."""

    device: str
    dynamo_graphs: int
    graphs: list[GraphReport] = field(default_factory=list)
    kernel_report: KernelReport | None = None  # per-kernel times, with explain(..., kernels=True)

    @property
    def plait_ops(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for g in self.graphs:
            total.update(g.plait_ops)
        return total

    @property
    def torch_ops(self) -> dict[str, str]:
        return {op: why for g in self.graphs for op, why in g.torch_ops.items()}

    @property
    def partitions(self) -> int:
        return sum(len(g.partitions) for g in self.graphs)

    @property
    def kernels(self) -> int:
        return sum(g.kernels for g in self.graphs)

    def __str__(self) -> str:
        lines = [
            f"plait on {self.device}: {self.dynamo_graphs} dynamo graph(s), {len(self.graphs)} ATen graph(s), "
            f"{self.partitions} plait partition(s), {self.kernels} kernel(s)"
        ]
        for g in self.graphs:
            lines.append(f"  {g.kind}: {len(g.partitions)} partition(s), {g.kernels} kernel(s)")
            for op, n in sorted(g.plait_ops.items()):
                lines.append(f"    plait    {op} x{n}")
            for op, why in sorted(g.torch_ops.items()):
                lines.append(f"    pytorch  {op}: {why}")
        if self.kernel_report is not None:
            lines += ["", str(self.kernel_report)]
        return "\n".join(lines)


def explain(
    model: Any,
    *example_inputs: Any,
    device: str | None = None,
    training: bool = False,
    kernels: bool = False,
    reps: int = 10,
) -> Explanation:
    """Compile `model` with the plait backend and run it once on `example_inputs` (with a backward pass of the
    summed outputs when `training`); the model's parameters, buffers and gradients are restored afterwards.
    With `kernels`, every plait partition's plan is then replayed `reps` times kernel by kernel for the per-kernel
    report (`Explanation.kernel_report`)."""
    dev = parse_options({"device": device} if device else None)
    sessions: list[Session] = []

    def record(s: Session) -> None:
        if not any(s is t for t in sessions):
            sessions.append(s)

    state = {k: v.detach().clone() for k, v in model.state_dict().items()} if hasattr(model, "state_dict") else {}
    grads = {id(p): p.grad for p in model.parameters()} if hasattr(model, "parameters") else {}
    backend = functools.partial(plait_backend, options={"device": dev})
    _RECORDERS.append(record)
    try:
        compiled = torch.compile(model, backend=backend)
        if training:
            outs = compiled(*example_inputs)
            flat = [o for o in (outs if isinstance(outs, (list, tuple)) else [outs]) if isinstance(o, torch.Tensor)]
            torch.stack([o.float().sum() for o in flat if o.requires_grad]).sum().backward()
        else:
            with torch.no_grad():
                compiled(*example_inputs)
    finally:
        _RECORDERS.remove(record)
        if state:
            with torch.no_grad():
                model.load_state_dict(state)
        for p in model.parameters() if hasattr(model, "parameters") else []:
            p.grad = grads.get(id(p))
    explanation = Explanation(dev, len(sessions), [g for s in sessions for g in s.graphs])
    if kernels:
        explanation.kernel_report = _kernel_report(explanation.graphs, reps)
    return explanation


def _kernel_report(graphs: list[GraphReport], reps: int) -> KernelReport:
    """One report over the plans of every partition; a kernel's group names its graph and partition."""
    plans, groups = [], []
    for g in graphs:
        for p in g.partitions:
            for c in p.compiled.values():
                if c is not None and c.plan is not None:
                    plans.append(c.plan)
                    groups.append(f"{g.kind}/{p.name}")
    return profile_plans(plans, reps, groups=groups)
