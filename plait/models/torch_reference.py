"""The same architectures as plait.models, built with torch.nn (needs the [torch] extra): reference models for
tests, benchmarks and side-by-side training. Their state_dicts load into the plait models and vice versa.

>>> from plait.models import torch_reference
>>> net = torch_reference.build("resnet18", num_classes=10)
"""

from __future__ import annotations

from typing import Any

import torch.nn

from plait.models.architectures import builders


def build(name: str, **kw: Any) -> torch.nn.Module:
    """A torch.nn.Module of architecture `name` (one of plait.models.MODELS)."""
    return builders(torch.nn)[name](**kw)  # type: ignore[no-any-return]
