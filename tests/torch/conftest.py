"""Fixtures for the torch.compile backend tests: a fresh dynamo cache per test, plait warnings visible."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
