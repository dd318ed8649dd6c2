"""docs/tile.md runs: every example on the page is a doctest."""

from __future__ import annotations

import doctest
from pathlib import Path


def test_tile_docs_run() -> None:
    path = Path(__file__).resolve().parents[2] / "docs" / "tile.md"
    res = doctest.testfile(
        str(path), module_relative=False, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert res.failed == 0, f"{res.failed} of {res.attempted} examples in docs/tile.md failed"


def test_package_docstrings_run() -> None:
    import plait.tile

    res = doctest.testmod(plait.tile)
    assert res.failed == 0 and res.attempted > 0
