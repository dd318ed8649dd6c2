"""Cut an ATen graph into plait partitions and PyTorch leftovers, and run each partition as a compiled plait Plan.

A partition compiles lazily, once per input signature (shapes, dtypes and the values of any integer arguments), so
graphs with symbolic sizes work too: sizes arrive as plain ints at call time. Tensor inputs are uploaded into the
plan's input buffers only when they changed: the same tensor object with the same version counter
(`tensor._version`, which every in-place write bumps, optimizer steps included) is not copied again. That keeps
parameters and buffers resident on the plait device between calls.
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from plait.errors import PlaitError, UnsupportedError
from plait.frontends.native.tensor import Tensor
from plait.frontends.torch.lowering import DTYPES, LOWERINGS
from plait.graph.node import Node
from plait.schedule.plan import Plan, read

PREFIX = "plait_"

# ops left to PyTorch on purpose, so no warning: dropout keeps torch's random stream (masks match eager exactly)
BY_DESIGN = {torch.ops.aten.native_dropout.default: "keeps PyTorch's random number stream"}

_DEVICE: list[str] = []


class PlaitFallbackWarning(UserWarning):
    """Part of a torch graph runs in PyTorch because plait cannot run it (the message names the ops)."""


def current_device() -> str:
    """The device of the partition being lowered (for ops that create tensors from nothing, like arange)."""
    return _DEVICE[-1]


@contextlib.contextmanager
def _on(device: str) -> Iterator[None]:
    _DEVICE.append(device)
    try:
        yield
    finally:
        _DEVICE.pop()


def op_name(target: Any) -> str:
    return str(target) if isinstance(target, torch._ops.OpOverload) else getattr(target, "__name__", str(target))


def is_host_op(node: torch.fx.Node) -> bool:
    """Python-level calls (getitem on torch results, size arithmetic) that are not tensor ops of either side."""
    return node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload)


def _tensor_vals(node: torch.fx.Node) -> list[Any]:
    vals, _ = tree_flatten(node.meta.get("val"))
    for a in node.all_input_nodes:
        more, _ = tree_flatten(a.meta.get("val"))
        vals += more
    return [v for v in vals if isinstance(v, torch.Tensor)]


def why_not(node: torch.fx.Node) -> str | None:
    """None if plait can run this fx node, else the reason it stays in PyTorch."""
    if node.op != "call_function":
        return "not a function call"
    if node.target is operator.getitem:
        src = node.args[0]
        return None if isinstance(src, torch.fx.Node) and why_not(src) is None else "getitem of a PyTorch result"
    if node.target in BY_DESIGN:
        return BY_DESIGN[node.target]
    lowering = LOWERINGS.get(node.target)
    if lowering is None:
        return "no plait lowering"
    bad = sorted({str(v.dtype).replace("torch.", "") for v in _tensor_vals(node) if v.dtype not in DTYPES})
    if bad:
        return f"dtype {', '.join(bad)} is not supported by plait"
    if lowering.supports is not None and not lowering.supports(node):
        return "these arguments are not supported by the plait lowering"
    return None


class _Support(OperatorSupportBase):
    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return why_not(node) is None


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("value", a) for a in args)


def _version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # inference tensors have no version counter
        return -1


class _Compiled:
    """One input signature of a partition: a Plan, where each output comes from, and what is already uploaded."""

    def __init__(self, plan: Plan | None, inputs: list[tuple[int, Node]], outputs: list[Any], tree: Any):
        self.plan = plan
        self.inputs = inputs  # (argument position, plan input node)
        self.outputs = (
            outputs  # per flat output: ("plan", node) | ("arg", position) | ("empty", (shape, dtype)) | ("value", v)
        )
        self.tree = tree
        self.resident: list[tuple[Any, int] | None] = [None] * len(inputs)
        self.uploads = 0

    @property
    def kernels(self) -> int:
        return len(self.plan.launches) if self.plan is not None else 0

    def __call__(self, args: tuple[Any, ...]) -> Any:
        plan = self.plan
        results: list[Any] = []
        if plan is not None:
            dev = plan.device
            for slot, (pos, node) in enumerate(self.inputs):
                a = args[pos]
                seen = self.resident[slot]
                version = _version(a)
                if seen is not None and seen[0]() is a and seen[1] == version and version >= 0:
                    continue
                dev.allocator.copy_in(plan.buffers[node.uid], a.detach().contiguous().numpy())
                self.resident[slot] = (weakref.ref(a), version)
                self.uploads += 1
            plan.run()
        for kind, what in self.outputs:
            if kind == "plan":
                assert plan is not None
                results.append(torch.from_numpy(read(plan.device, plan._buffer_of(what), what)))
            elif kind == "arg":
                results.append(args[what])
            elif kind == "empty":
                results.append(torch.empty(what[0], dtype=what[1]))
            else:
                results.append(what)
        return tree_unflatten(results, self.tree)


class PlaitPartition(torch.nn.Module):
    """A fused fx submodule whose ATen ops all have plait lowerings; runs as a plait Plan per input signature."""

    def __init__(self, gm: torch.fx.GraphModule, device: str, name: str, on_fallback: Any):
        super().__init__()
        self.gm = gm
        self.device = device
        self.name = name
        self.on_fallback = on_fallback
        self.compiled: dict[tuple[Any, ...], _Compiled | None] = {}  # None: this signature runs in PyTorch
        self.ops = Counter(op_name(n.target) for n in gm.graph.nodes if n.op == "call_function" and not is_host_op(n))

    def forward(self, *args: Any) -> Any:
        key = _signature(args)
        if key not in self.compiled:
            self.compiled[key] = self._build(args)
        entry = self.compiled[key]
        if entry is None:
            return self.gm(*args)
        try:
            return entry(args)
        except PlaitError:
            raise
        except Exception as e:
            raise PlaitError(
                f"plait partition {self.name} ({', '.join(self.ops)}) failed on {self.device}: {e}; "
                "nothing was written to the model; try options={'device': 'cpu'} or report the ops above"
            ) from e

    def _build(self, args: tuple[Any, ...]) -> _Compiled | None:
        try:
            with _on(self.device):
                return self._lower(args)
        except Exception as e:
            failing = getattr(e, "plait_op", None) or ", ".join(self.ops)
            self.on_fallback({failing: f"{type(e).__name__}: {e}"})
            return None

    def _lower(self, args: tuple[Any, ...]) -> _Compiled:
        env: dict[torch.fx.Node, Any] = {}
        inputs: list[tuple[int, Node]] = []
        by_uid: dict[int, int] = {}
        placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        for pos, (ph, a) in enumerate(zip(placeholders, args, strict=True)):
            if isinstance(a, torch.Tensor):
                if a.dtype not in DTYPES:
                    raise UnsupportedError(f"input {ph.name} has dtype {a.dtype}, which plait does not support")
                node = Node("input", (), None, tuple(a.shape), DTYPES[a.dtype], self.device)
                inputs.append((pos, node))
                by_uid[node.uid] = pos
                env[ph] = Tensor(node)
            else:
                env[ph] = a
        out_node = None
        for n in self.gm.graph.nodes:
            if n.op == "call_function":
                env[n] = _lower_node(n, env)
            elif n.op == "output":
                out_node = n
        assert out_node is not None
        flat, tree = tree_flatten(tree_map(lambda v: env[v] if isinstance(v, torch.fx.Node) else v, out_node.args[0]))
        outputs: list[Any] = []
        plan_outs: list[Node] = []
        for v in flat:
            if not isinstance(v, Tensor):
                outputs.append(("value", v))
            elif v.node.uid in by_uid:
                outputs.append(("arg", by_uid[v.node.uid]))
            elif v.numel() == 0:
                outputs.append(("empty", (v.shape, _torch_dtype(v))))
            else:
                outputs.append(("plan", v.node))
                plan_outs.append(v.node)
        plan = Plan(plan_outs, [node for _, node in inputs]) if plan_outs else None
        return _Compiled(plan, inputs, outputs, tree)


def _torch_dtype(t: Tensor) -> torch.dtype:
    return next(k for k, v in DTYPES.items() if v == t.dtype)


def _lower_node(n: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    args = tree_map(lambda v: env[v] if isinstance(v, torch.fx.Node) else v, n.args)
    kwargs = tree_map(lambda v: env[v] if isinstance(v, torch.fx.Node) else v, dict(n.kwargs))
    if n.target is operator.getitem:
        return args[0][args[1]]
    try:
        out = LOWERINGS[n.target].fn(*args, **kwargs)
        return _match_meta(out, n.meta.get("val"), n)
    except Exception as e:
        e.plait_op = op_name(n.target)  # type: ignore[attr-defined]
        raise


def _match_meta(out: Any, val: Any, n: torch.fx.Node) -> Any:
    """Check a lowering's result against the FakeTensor torch recorded, and cast to its dtype where promotion rules
    differ (e.g. a 0-d tensor operand, which torch treats as weak)."""
    if isinstance(out, (list, tuple)):
        vals = val if isinstance(val, (list, tuple)) else [None] * len(out)
        return type(out)(_match_meta(o, v, n) for o, v in zip(out, vals, strict=False))
    if not isinstance(out, Tensor) or not isinstance(val, torch.Tensor):
        return out
    symbolic = any(isinstance(s, torch.SymInt) for s in val.shape)  # sizes known only at call time
    want = tuple(int(s) for s in val.shape) if not symbolic else out.shape
    if out.shape != want:
        raise PlaitError(f"{op_name(n.target)}: the plait lowering produced shape {out.shape}, torch expects {want}")
    if val.dtype in DTYPES and out.dtype != DTYPES[val.dtype]:
        return out.astype(DTYPES[val.dtype])
    return out


def partition(gm: torch.fx.GraphModule, device: str, on_fallback: Any) -> tuple[torch.fx.GraphModule, dict[str, str]]:
    """Fuse the plait-supported nodes of gm into PlaitPartition submodules; returns gm and {torch op: reason}."""
    support = _Support()
    parts = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True).propose_partitions()
    left: dict[str, str] = {}
    in_part = {n for p in parts for n in p.nodes}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n not in in_part and not is_host_op(n):
            left[op_name(n.target)] = why_not(n) or "left out by the partitioner"
    if parts:
        gm = fuse_by_partitions(gm, [p.nodes for p in parts], prefix=PREFIX)
        for name, sub in list(gm.named_children()):
            if name.startswith(PREFIX) and isinstance(sub, torch.fx.GraphModule):
                setattr(gm, name, PlaitPartition(sub, device, name, on_fallback))
    return gm, left
