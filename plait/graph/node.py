"""The tensor graph IR: an immutable DAG of Nodes. A realized node holds a device Buffer and no sources."""

from __future__ import annotations

import itertools
from typing import Any

from plait.dtypes import DType
from plait.errors import DeviceError

_ids = itertools.count()
GRAD_MODE = [True]  # False inside plait.no_grad()


class Node:
    """One value in the graph: `op` names an entry of plait.graph.ops.OPS; `arg` is that op's static argument."""

    __slots__ = ("__weakref__", "arg", "buffer", "device", "dtype", "op", "rg", "shape", "srcs", "uid")
    op: str
    srcs: tuple[Node, ...]
    shape: tuple[int, ...]
    dtype: DType
    device: str

    def __init__(self, op: str, srcs: tuple[Node, ...], arg: Any, shape: tuple[int, ...], dtype: DType, device: str):
        for src in srcs:
            if src.device != device:
                raise DeviceError(
                    f"{op}: inputs on different devices ({src.device} and {device}); move one with .to(device)"
                )
        self.op = op
        self.srcs = srcs
        self.arg = arg
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.buffer: Any = None
        self.uid = next(_ids)
        self.rg: bool = GRAD_MODE[0] and any(s.rg for s in srcs)  # part of a graph that autograd will walk

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def realized(self) -> bool:
        return self.buffer is not None or self.op == "input"

    def set_buffer(self, buffer: Any) -> None:
        """Attach `buffer`. Outside autograd graphs the sources are dropped so the history can be freed; inside
        one they stay, because backward() walks them (the buffer then doubles as the saved activation)."""
        self.buffer = buffer
        if not self.rg:
            self.op = "buffer"
            self.srcs = ()
            self.arg = None

    def __repr__(self) -> str:
        return f"Node({self.op}, {self.shape}, {self.dtype.name}, #{self.uid})"


def toposort(roots: list[Node], through_realized: bool = False) -> list[Node]:
    """Nodes reachable from roots, sources before users (iterative: graphs can be deep). Realized nodes are
    leaves unless `through_realized` (autodiff walks the whole recorded history)."""
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node.uid in seen:
            continue
        seen.add(node.uid)
        stack.append((node, True))
        if node.buffer is not None and not through_realized:
            continue
        for s in reversed(node.srcs):
            if s.uid not in seen:
                stack.append((s, False))
    return order
