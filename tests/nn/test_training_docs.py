"""docs/training.md runs: its example is a doctest."""

from __future__ import annotations

import doctest
from pathlib import Path


def test_training_docs_run() -> None:
    path = Path(__file__).resolve().parents[2] / "docs" / "training.md"
    res = doctest.testfile(str(path), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0, f"{res.failed} of {res.attempted} examples in docs/training.md failed"
