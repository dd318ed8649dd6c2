"""The benchmark matrix: models x modes x frameworks. Each cell is checked against PyTorch eager before it is timed.

A cell ends as 'ok' (timed), 'mismatch' (outputs disagree: not timed), 'error' (the framework raised: not timed)
or 'skipped' (the framework is missing or does not do this mode), always with a note saying why.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from plait.bench.models import BenchModel
from plait.bench.runners import Case, Runner, TorchRunner
from plait.bench.timing import measure

MODES = ("infer-1", "infer-batch", "train")
# Relative tolerances (max abs difference / max abs reference) for float32 computed by different algorithms.
TOLERANCES = {"infer": 2e-3, "loss": 2e-3, "param_update": 2e-2}


@dataclass
class Settings:
    warmup: int = 2
    iters: int = 10
    max_seconds: float = 20.0
    batch: int | None = None  # overrides every model's larger batch
    seed: int = 0
    lr: float = 0.01


class Progress:
    """A one-line progress bar on stderr (a line per cell when stderr is not a terminal)."""

    def __init__(self, total: int, enabled: bool = True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def show(self, label: str, final: bool = False) -> None:
        if not self.enabled or not (self.tty or final):
            return
        width = 24
        filled = width * self.done // max(self.total, 1)
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
            f"{time.perf_counter() - self.start:5.0f}s {label}"
        )
        if self.tty:
            sys.stderr.write("\r\033[K" + line[:150])
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def advance(self, label: str) -> None:
        self.done += 1
        self.show(label, final=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def rel_error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest max|got - want| / max|want| over the outputs (inf when shapes differ or values are not finite)."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape or not np.all(np.isfinite(g)):
            return float("inf")
        worst = max(worst, float(np.abs(g - w).max(initial=0.0) / (np.abs(w).max(initial=0.0) + 1e-12)))
    return worst


def _mismatch(mode: str, got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, str | None]:
    if mode == "infer":
        err = rel_error(got, want)
        return err, None if err <= TOLERANCES["infer"] else f"output differs from torch eager (rel. error {err:.2e})"
    loss_err = rel_error(got[:1], want[:1])
    upd_err = rel_error(got[1:], want[1:])
    if loss_err > TOLERANCES["loss"]:
        return loss_err, f"loss {float(got[0]):.6g} differs from torch eager's {float(want[0]):.6g}"
    if upd_err > TOLERANCES["param_update"]:
        return upd_err, f"parameter update differs from torch eager (rel. error {upd_err:.2e})"
    return max(loss_err, upd_err), None


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def run_cell(runner: Runner, case: Case, want: list[np.ndarray], s: Settings) -> dict[str, Any]:
    """Prepare, check, and (only if the check passes) time one framework on one case."""
    mode = "train" if case.mode == "train" else "infer"
    if mode not in runner.modes:
        return {"status": "skipped", "note": f"{runner.name} does not run the {mode} mode"}
    t0 = time.perf_counter()
    try:
        prepared = runner.prepare(case)
        got = prepared.check()
        runner.sync()
    except Exception as e:
        return {"status": "error", "note": _short(e), "trace": traceback.format_exc(limit=-6)}
    setup_s = time.perf_counter() - t0
    err, problem = _mismatch(mode, got, want)
    cell: dict[str, Any] = {"setup_s": round(setup_s, 3), "rel_error": err}
    if problem:
        return {**cell, "status": "mismatch", "note": problem}
    try:
        timing = measure(prepared.step, runner.sync, s.warmup, s.iters, s.max_seconds)
    except Exception as e:
        return {**cell, "status": "error", "note": "while timing: " + _short(e)}
    if prepared.kernels is not None:
        try:
            cell["kernels"] = prepared.kernels(s.iters)
        except Exception as e:
            cell["kernels"] = {"error": _short(e)}  # the timing stands; the report says why it is missing
    return {
        **cell,
        "status": "ok",
        "note": "; ".join(prepared.notes),
        **timing,
        "samples_per_s": case.batch * 1e3 / timing["median_ms"],
    }


def _reference(case: Case, torch_device: str) -> list[np.ndarray]:
    return TorchRunner(torch_device).prepare(case).check()


def run_matrix(
    models: list[BenchModel],
    modes: list[str],
    runners: list[Runner],
    s: Settings,
    torch_device: str,
    progress: Progress | None = None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every (model, mode, framework) cell, for the modes each model runs (BenchModel.modes); a model that fails to
    build marks its cells as errors and the run goes on."""
    import torch

    cells: list[dict[str, Any]] = []
    missing = {r.name: r.unavailable() for r in runners}
    for spec in models:
        torch.manual_seed(s.seed)
        reference_model, build_error = None, ""
        try:
            reference_model = spec.torch_factory()
        except Exception as e:
            build_error = _short(e)
        for mode in [m for m in modes if m in spec.modes]:
            batch = 1 if mode == "infer-1" else (s.batch or spec.batch)
            x, y = spec.inputs(batch, s.seed)
            case = Case(spec, "train" if mode == "train" else "infer", batch, x, y, reference_model, s.lr)
            want: list[np.ndarray] | None = None
            ref_error = build_error
            for runner in runners:
                label = f"{spec.name} {mode} b{batch} {runner.name}"
                if progress:
                    progress.show(label)
                base = {"model": spec.name, "mode": mode, "batch": batch, "framework": runner.name}
                if missing[runner.name]:
                    cell = {"status": "skipped", "note": missing[runner.name]}
                elif ref_error:
                    cell = {"status": "error", "note": f"reference: {ref_error}"}
                else:
                    try:
                        want = want if want is not None else _reference(case, torch_device)
                    except Exception as e:
                        ref_error = _short(e)
                    cell = (
                        {"status": "error", "note": f"reference: {ref_error}"}
                        if want is None
                        else run_cell(runner, case, want, s)
                    )
                cells.append({**base, **cell})
                if progress:
                    progress.advance(label)
                if cell["status"] in ("error", "mismatch"):
                    log(f"  {label}: {cell['status']}: {cell['note']}")
    return cells
