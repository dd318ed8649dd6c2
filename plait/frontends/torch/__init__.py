"""PyTorch frontend: the "plait" torch.compile backend and plait.explain.

`torch.compile(model, backend="plait", options={"device": "cpu"})` works without importing plait: the backend is
registered through the `torch_dynamo_backends` entry point. See docs/torch.md.

Importing this module sets `torch._dynamo.config.allow_rnn = True` so that nn.GRU / nn.LSTM are traced into the graph
(and compiled by plait) instead of forcing dynamo to run the whole frame eagerly.
"""

from __future__ import annotations

from typing import Any

import torch._dynamo

torch._dynamo.config.allow_rnn = True


def plait_backend(gm: Any, example_inputs: list[Any], options: dict[str, Any] | None = None) -> Any:
    """The dynamo backend (see plait.frontends.torch.backend)."""
    from plait.frontends.torch.backend import plait_backend as backend

    return backend(gm, example_inputs, options)


def explain(
    model: Any,
    *example_inputs: Any,
    device: str | None = None,
    training: bool = False,
    kernels: bool = False,
    reps: int = 10,
) -> Any:
    """Compile and run `model` once with the plait backend; report which ATen ops ran in plait and which in
    PyTorch (with the reason), the partitions, and how many kernels the plans have (timed one by one with
    `kernels`)."""
    from plait.frontends.torch.explaining import explain as run

    return run(model, *example_inputs, device=device, training=training, kernels=kernels, reps=reps)


__all__ = ["explain", "plait_backend"]
