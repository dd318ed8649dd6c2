"""`plait bench --check REFERENCE.json`: compare a run with a saved one and flag what got slower or stopped working."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plait.bench.models import BenchError


def load_reference(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise BenchError(f"reference {p} does not exist (give a results.json written by plait bench)")
    try:
        ref = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BenchError(f"reference {p} is not JSON ({e})") from None
    if not isinstance(ref, dict) or not isinstance(ref.get("cells"), list):
        raise BenchError(f"reference {p} is not a plait bench results.json (no 'cells' list)")
    return ref


def _key(c: dict[str, Any]) -> tuple[str, str, int, str]:
    return (c["model"], c["mode"], int(c["batch"]), c["framework"])


def compare(current: dict[str, Any], reference: dict[str, Any], threshold: float) -> list[dict[str, Any]]:
    """One row per cell present in both runs: the time ratio current/reference and whether it is a regression
    (slower by more than `threshold`, e.g. 0.1 = 10%, or timed in the reference but not any more)."""
    ref = {_key(c): c for c in reference["cells"]}
    rows = []
    for c in current["cells"]:
        r = ref.get(_key(c))
        if r is None or r["status"] != "ok":
            continue
        row: dict[str, Any] = {"model": c["model"], "mode": c["mode"], "batch": c["batch"], "framework": c["framework"]}
        if c["status"] != "ok":
            rows.append({**row, "ratio": None, "regression": True, "why": f"was ok, now {c['status']}"})
            continue
        ratio = c["median_ms"] / r["median_ms"]
        slower = ratio > 1 + threshold
        why = f"{r['median_ms']:.3f} -> {c['median_ms']:.3f} ms ({ratio:.2f}x)"
        rows.append({**row, "ratio": ratio, "regression": slower, "why": why})
    return rows


def format_rows(rows: list[dict[str, Any]], threshold: float) -> list[str]:
    bad = [r for r in rows if r["regression"]]
    lines = [f"check: {len(rows)} cells compared, {len(bad)} regressions beyond {threshold:.0%}"]
    for r in rows:
        mark = "REGRESSION" if r["regression"] else "ok"
        lines.append(f"  {mark:10} {r['model']} {r['mode']} b{r['batch']} {r['framework']}: {r['why']}")
    return lines
