"""Module, Parameter and the state-dict machinery, mirroring torch.nn.Module's names and behaviour.

>>> import plait
>>> lin = plait.nn.Linear(3, 2, device="cpu")
>>> sorted(lin.state_dict())
['bias', 'weight']
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from plait.errors import PlaitError
from plait.frontends.native import tensor as _tensor
from plait.frontends.native.tensor import Tensor
from plait.graph.node import Node
from plait.schedule.plan import realize


class StateDictError(PlaitError, KeyError):
    """A state_dict that does not fit a module: missing or unexpected keys, or wrong shapes/dtypes."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Parameter(Tensor):
    """A Tensor that a Module registers as trainable (requires_grad by default).

    Its identity is stable: optimizers and load_state_dict swap the graph node underneath (see `assign`)."""

    def __init__(self, data: Any, requires_grad: bool = True, device: str | None = None):
        t = data if isinstance(data, Tensor) else Tensor.from_numpy(np.asarray(data, dtype=np.float32), device=device)
        super().__init__(t.detach().node)
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape}, dtype={self.dtype.name}, device={self.device!r})"


def assign(t: Tensor, node: Node) -> None:
    """Make `t` hold the (realized) value of `node` in place, keeping `t` a gradient leaf if it was one."""
    was_leaf = t.node.rg and not t.node.srcs
    if was_leaf:
        _tensor._LEAVES.pop(t.node.uid, None)
    if node.srcs or node.rg:
        fresh = Node("buffer", (), None, node.shape, node.dtype, node.device)
        fresh.buffer = node.buffer
        node = fresh
    t.node = node
    if was_leaf:
        node.rg = True  # still the same trainable leaf: not a requires_grad change that re-traces compiled steps
        t.requires_grad_(True)


def realize_all(nodes: list[Node]) -> None:
    """Compute many pending nodes in one plan (one compile and launch sequence per device)."""
    realize([n for n in nodes if not n.realized])


_PENDING: weakref.WeakSet[Module] = weakref.WeakSet()


def flush_pending() -> None:
    """Realize buffers that modules updated lazily (BatchNorm running statistics), so no history accumulates."""
    nodes = [b.node for m in list(_PENDING) for b in m._buffers.values() if b is not None and not b.node.realized]
    _PENDING.clear()
    realize_all(nodes)


class Module:
    """Base class of every layer: holds Parameters, buffers and sub-modules in registration order."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---------------------------------------------------------------- registration

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise PlaitError(f"{type(self).__name__}: call super().__init__() before assigning attribute {name!r}")
        if isinstance(value, Parameter):
            self._modules.pop(name, None)
            self._buffers.pop(name, None)
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._parameters.pop(name, None)
            self._buffers.pop(name, None)
            self._modules[name] = value
        elif name in self._buffers:
            if value is not None and not isinstance(value, Tensor):
                raise PlaitError(
                    f"{type(self).__name__}.{name} is a buffer; assign a Tensor or None, not {type(value).__name__}"
                )
            self._buffers[name] = value
        elif name in self._parameters:
            if value is not None:
                raise PlaitError(f"{type(self).__name__}.{name} is a Parameter; assign a plait.nn.Parameter or None")
            self._parameters[name] = None
        elif name in self._modules and value is None:
            self._modules[name] = None
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for table in (self._parameters, self._buffers, self._modules):
            if name in table:
                del table[name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        self._buffers[name] = tensor
        if not persistent:
            self._non_persistent.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        self._parameters[name] = param

    def add_module(self, name: str, module: Module | None) -> None:
        self._modules[name] = module

    # ---------------------------------------------------------------- traversal

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for mp, m in mods:
            for name, p in m._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mp}.{name}" if mp else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        mods = self.named_modules(prefix) if recurse else iter([(prefix, self)])
        for mp, m in mods:
            for name, b in m._buffers.items():
                if b is not None:
                    yield (f"{mp}.{name}" if mp else name), b

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], None]) -> Module:
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---------------------------------------------------------------- modes and gradients

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            if m.training != mode:
                _tensor.STEP_SHAPING_CHANGES[0] += 1  # a compiled step traced in the other mode must be traced again
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, flag: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(flag)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters():
            p.grad = None

    def to(self, device: str) -> Module:
        """Move every parameter and buffer to `device` (parameters keep their identity)."""
        for p in self.parameters():
            if p.device != device:
                assign(p, Tensor.from_numpy(p.numpy(), device=device).node)
        for m in self.modules():
            for name, b in list(m._buffers.items()):
                if b is not None and b.device != device:
                    m._buffers[name] = Tensor.from_numpy(b.numpy(), device=device)
        return self

    # ---------------------------------------------------------------- state dicts

    def _state_entries(self) -> Iterator[tuple[str, Module, str, str]]:
        """(full key, owning module, attribute, 'param'|'buffer') for every state_dict entry, in torch's order."""
        for mp, m in self.named_modules():
            for name, p in m._parameters.items():
                if p is not None:
                    yield (f"{mp}.{name}" if mp else name), m, name, "param"
            for name, b in m._buffers.items():
                if b is not None and name not in m._non_persistent:
                    yield (f"{mp}.{name}" if mp else name), m, name, "buffer"

    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Parameters and persistent buffers by dotted name (the same keys torch uses for the same architecture)."""
        flush_pending()
        out: OrderedDict[str, Tensor] = OrderedDict()
        for key, m, name, kind in self._state_entries():
            out[key] = (m._parameters if kind == "param" else m._buffers)[name]
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy values (plait Tensors, NumPy arrays or torch tensors) into this module. Every key, shape and dtype
        is checked before anything is written, so a bad state_dict raises StateDictError and changes nothing.
        Returns (missing_keys, unexpected_keys), both empty when strict."""
        entries = {key: (m, name, kind) for key, m, name, kind in self._state_entries()}
        missing = [k for k in entries if k not in state_dict]
        unexpected = [k for k in state_dict if k not in entries]
        problems = []
        if strict and missing:
            problems.append(f"missing keys {missing}")
        if strict and unexpected:
            problems.append(f"unexpected keys {unexpected}")
        staged: list[tuple[Module, str, str, np.ndarray]] = []
        for key, (m, name, kind) in entries.items():
            if key not in state_dict:
                continue
            cur = (m._parameters if kind == "param" else m._buffers)[name]
            arr = _to_numpy(state_dict[key], key)
            if tuple(arr.shape) != cur.shape:
                problems.append(f"{key}: shape {tuple(arr.shape)} in the state_dict, {cur.shape} in {type(m).__name__}")
                continue
            if cur.dtype.is_float != (arr.dtype.kind == "f"):
                problems.append(f"{key}: dtype {arr.dtype} in the state_dict cannot load into {cur.dtype.name}")
                continue
            staged.append((m, name, kind, arr.astype(cur.dtype.np)))
        if problems:
            raise StateDictError(
                f"load_state_dict into {type(self).__name__}: " + "; ".join(problems) + " (nothing was loaded)"
            )
        for m, name, kind, arr in staged:
            cur = (m._parameters if kind == "param" else m._buffers)[name]
            fresh = Tensor.from_numpy(arr, device=cur.device)
            if kind == "param":
                assign(cur, fresh.node)
            else:
                m._buffers[name] = fresh
        return missing, unexpected

    # ---------------------------------------------------------------- calling

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise PlaitError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self.named_children():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return "\n".join(lines) + (")" if len(lines) == 1 else "\n)")


def _to_numpy(v: Any, key: str) -> np.ndarray:
    if isinstance(v, Tensor):
        return v.numpy()
    if hasattr(v, "detach") and hasattr(v, "cpu"):  # a torch tensor, without importing torch
        return np.asarray(v.detach().cpu().numpy())
    try:
        return np.asarray(v)
    except Exception as e:
        raise StateDictError(f"load_state_dict: value for {key} is a {type(v).__name__}, not an array") from e
