"""plait.explain for plait's own callables: the per-kernel report of the plan that a `plait.jit` function, a plain
function of plait Tensors, or a `plait.onnx.InferenceSession` compiles for the given inputs.

>>> import numpy as np, plait
>>> f = plait.jit(lambda a, b: (a @ b).relu(), device="cpu")
>>> report = plait.explain(f, np.ones((32, 48), np.float32), np.ones((48, 16), np.float32), reps=2)
>>> [(k.kind, k.flops) for k in report.kernels]
[('gemm', 49664)]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plait.errors import PlaitError
from plait.frontends.native.jit import Jit
from plait.frontends.native.tensor import Tensor
from plait.runtime import canonical
from plait.schedule.plan import Plan
from plait.schedule.profile import KernelReport, profile_plan


def _onnx_plan(session: Any, inputs: tuple[Any, ...]) -> Plan:
    if len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise PlaitError(
            "plait.explain(session, feed): an InferenceSession takes one feed dict {input name: array}, got "
            f"{len(inputs)} argument(s)"
        )
    # The session compiles (or reuses) one plan per input signature inside run(); note which one this feed used.
    used: list[Any] = []
    compile_plan = session._compile

    def record(*args: Any, **kwargs: Any) -> Any:
        used.append(compile_plan(*args, **kwargs))
        return used[-1]

    session._compile = record
    try:
        session.run(None, inputs[0])
    finally:
        del session._compile
    plan: Plan | None = used[-1].plan if used else None
    if plan is None:
        raise PlaitError("plait.explain(session, feed): the model's outputs need no kernels (constants or inputs)")
    return plan


def _jit_plan(fn: Any, inputs: tuple[Any, ...], device: str | None) -> Plan:
    if isinstance(fn, Jit):
        if device is not None and fn.device != device:
            raise PlaitError(
                f"plait.explain: this plait.jit function is compiled for {fn.device}, not {device}; "
                "drop device= or jit the function for that device"
            )
        jitted = fn
    else:
        jitted = Jit(fn, device)
    arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in inputs]
    jitted(*arrays)
    plan, _ = jitted.plan_for(arrays)
    return plan


def kernel_report(fn: Any, *inputs: Any, device: str | None = None, reps: int = 10) -> KernelReport:
    """Compile and run `fn` once on `inputs` (arrays or Tensors; a feed dict for an ONNX session), then replay its
    plan `reps` times kernel by kernel: time, GFLOP/s, GB/s and % of the device's measured peaks per kernel."""
    device = canonical(device) if device else None
    if type(fn).__name__ == "InferenceSession" and type(fn).__module__.startswith("plait.onnx"):
        if device is not None and device != fn.device:
            raise PlaitError(f"plait.explain: this InferenceSession runs on {fn.device}, not {device}")
        plan = _onnx_plan(fn, inputs)
    elif callable(fn):
        plan = _jit_plan(fn, inputs, device)
    else:
        raise PlaitError(
            f"plait.explain: cannot explain a {type(fn).__name__}; pass a torch model, a plait.jit function, a "
            "function of plait Tensors, or a plait.onnx.InferenceSession"
        )
    return profile_plan(plan, reps)
