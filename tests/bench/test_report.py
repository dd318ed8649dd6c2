"""Report writers (JSON, markdown, PNG, self-contained HTML) and the --check comparison."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from plait.bench import check, report


def _cell(model: str, mode: str, fw: str, ms: float, status: str = "ok") -> dict[str, Any]:
    c: dict[str, Any] = {"model": model, "mode": mode, "batch": 1, "framework": fw, "status": status, "note": ""}
    if status == "ok":
        c.update(median_ms=ms, p25_ms=ms * 0.9, p75_ms=ms * 1.2, min_ms=ms * 0.8, max_ms=ms * 1.5, iters=5)
    else:
        c["note"] = "output differs from torch eager"
    return c


def _result() -> dict[str, Any]:
    cells = [
        _cell("resnet18", "infer-1", "plait:cpu", 20.0),
        _cell("resnet18", "infer-1", "torch", 10.0),
        _cell("gru", "infer-1", "plait:cpu", 0.0, status="mismatch"),
        _cell("gru", "infer-1", "torch", 2.0),
        _cell("gru", "train", "torch", 8.0),
    ]
    tasks = [
        {
            "task": "cifar",
            "data": "generated",
            "framework": "torch",
            "status": "ok",
            "seconds": 3.0,
            "unit": "per epoch",
            "samples_per_s": 341.3,
            "accuracy": 0.5,
        }
    ]
    env = {
        "date": "today",
        "host": {"cpu": "cpu", "cores": 2, "nvidia": ""},
        "versions": {"torch": "2"},
        "plait_devices": {"cpu": {"name": "x"}},
        "threads": 2,
        "thread_env": {"OMP_WAIT_POLICY": "PASSIVE"},
    }
    settings = {"command": "plait bench", "dtype": "float32", "layout": "NCHW", "warmup": 2, "iters": 5}
    return {"schema": 1, "cells": cells, "tasks": tasks, "environment": env, "settings": settings}


def test_markdown_table() -> None:
    md = report.markdown(_result())
    assert "| model | batch | plait:cpu | torch | torch / plait:cpu |" in md
    assert "| resnet18 | 1 | 20.00 ±3.00 | 10.00 ±1.50 | 0.50x |" in md
    assert "FAILED (mismatch)" in md and "## training step (ms)" in md
    assert "gru infer-1 b1 plait:cpu: mismatch: output differs" in md
    assert "| cifar | generated | torch | 3.00 s per epoch | 341.3 | 0.5000 | ok |" in md


def test_write_all(tmp_path: Path) -> None:
    paths = report.write_all(_result(), tmp_path / "out")
    assert json.loads(paths["json"].read_text())["cells"][0]["median_ms"] == 20.0
    assert paths["plot-infer-1"].read_bytes()[:4] == b"\x89PNG"
    page = paths["html"].read_text()
    assert page.count("data:image/png;base64,") == 2 and "<table>" in page and 'src="http' not in page


def test_check_flags_regressions(tmp_path: Path) -> None:
    ref = _result()
    cur = copy.deepcopy(ref)
    cur["cells"][0]["median_ms"] = 25.0  # 25% slower
    cur["cells"][1]["median_ms"] = 10.5  # 5% slower: within the threshold
    cur["cells"][3]["status"] = "error"  # timed before, broken now
    rows = check.compare(cur, ref, threshold=0.10)
    flagged = {(r["model"], r["framework"]) for r in rows if r["regression"]}
    assert flagged == {("resnet18", "plait:cpu"), ("gru", "torch")}
    assert len(rows) == 4  # the mismatch cell of the reference has no time to compare with
    assert "2 regressions beyond 10%" in check.format_rows(rows, 0.10)[0]
    assert not any(r["regression"] for r in check.compare(ref, ref, 0.10))


def test_check_reference_errors(tmp_path: Path) -> None:
    import pytest

    from plait.bench.models import BenchError

    (tmp_path / "a.json").write_text("{not json")
    (tmp_path / "b.json").write_text("[1, 2]")
    for name, msg in (("a.json", "not JSON"), ("b.json", "no 'cells'"), ("c.json", "does not exist")):
        with pytest.raises(BenchError, match=msg):
            check.load_reference(tmp_path / name)
