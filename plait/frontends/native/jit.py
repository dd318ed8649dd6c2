"""`plait.jit`: trace a function of Tensors once per input signature into a compiled Plan, then replay it.

Replay copies the inputs into the plan's buffers, launches the pre-bound kernels and returns NumPy arrays; no
graph is built, nothing is rendered or compiled.

>>> import numpy as np, plait
>>> f = plait.jit(lambda x, w: (x @ w).relu().sum(axis=1), device="cpu")
>>> f(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)).tolist()
[12.0, 12.0]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from plait import dtypes
from plait.errors import PlaitError
from plait.frontends.native.tensor import Tensor
from plait.graph.node import Node
from plait.runtime import canonical, default_device
from plait.schedule.plan import Plan


class Jit:
    def __init__(self, fn: Callable[..., Any], device: str | None = None):
        self.fn = fn
        self.device = canonical(device) if device else default_device()
        self.plans: dict[Any, tuple[Plan, bool]] = {}

    def plan_for(self, arrays: list[np.ndarray]) -> tuple[Plan, bool]:
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        if key not in self.plans:
            inputs = [Node("input", (), None, a.shape, dtypes.from_numpy_dtype(a.dtype), self.device) for a in arrays]
            out = self.fn(*(Tensor(n) for n in inputs))
            single = isinstance(out, Tensor)
            outs = [out] if single else list(out)
            if not all(isinstance(o, Tensor) for o in outs):
                raise PlaitError("plait.jit: the function must return a Tensor or a sequence of Tensors")
            self.plans[key] = (Plan([o.node for o in outs], inputs), single)
        return self.plans[key]

    def __call__(self, *args: Any) -> Any:
        arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in args]
        plan, single = self.plan_for(arrays)
        outs = plan(*arrays)
        return outs[0] if single else outs


def jit(fn: Callable[..., Any] | None = None, device: str | None = None) -> Any:
    """Compile `fn` (Tensors in, Tensor(s) out) into a replayable plan per input shape/dtype signature."""
    if fn is None:
        return lambda f: Jit(f, device)
    return Jit(fn, device)
