"""The benchmark matrix: models x modes x frameworks. Each cell is checked against PyTorch eager before it is timed.

A cell ends as 'ok' (timed), 'mismatch' (outputs disagree: not timed), 'error' (the framework raised: not timed)
or 'skipped' (the framework is missing or does not do this mode), always with a note saying why.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
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
# Relative tolerances for float32 computed by different algorithms: max abs difference / max abs reference for the
# outputs and the loss, ||difference|| / ||reference|| for the parameter update (see `_mismatch`).
TOLERANCES = {"infer": 2e-3, "loss": 2e-3, "param_update": 2e-2}
# A parameter update further than `param_update` from torch's passes when it is at most this many times as far from
# the float64 update as torch's own float32 update is (both are float32 noise around the exact answer).
NOISE_FACTOR = 3.0


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


def norm_error(got: np.ndarray, want: np.ndarray) -> float:
    """||got - want|| / ||want|| in float64 (inf when shapes differ or values are not finite)."""
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return float("inf")
    return float(np.linalg.norm(g - w) / (np.linalg.norm(w) + 1e-30))


def _mismatch(
    mode: str,
    got: list[np.ndarray],
    want: list[np.ndarray],
    exact: Callable[[], list[np.ndarray]] | None = None,
) -> tuple[float, str | None]:
    """(error, problem or None) of a cell's check outputs against torch eager's.

    A training step's parameter update is the gradient after a whole backward pass, so float32 rounding in a deep
    or long network (mobilenet_v2's first convolution, a GRU's embedding) moves it by a few percent in any
    framework: PyTorch float32 on the cpu is 3.6e-2 (GRU embedding) and 8.4e-3 (mobilenet_v2) from its own float64
    update at batch 64 (benchmarks/train_update_noise.py). Its norm-relative error is checked against the fixed
    bound first; past it, `exact()` (the float64 check outputs) decides: the update passes when it is at most
    NOISE_FACTOR times as far from the float64 update as torch's float32 update is. A wrong gradient is O(1) off.
    """
    if mode == "infer":
        err = rel_error(got, want)
        return err, None if err <= TOLERANCES["infer"] else f"output differs from torch eager (rel. error {err:.2e})"
    loss_err = rel_error(got[:1], want[:1])
    if loss_err > TOLERANCES["loss"]:
        return loss_err, f"loss {float(got[0]):.6g} differs from torch eager's {float(want[0]):.6g}"
    upd_err = norm_error(got[1], want[1])
    if upd_err <= TOLERANCES["param_update"]:
        return max(loss_err, upd_err), None
    problem = f"parameter update differs from torch eager (norm rel. error {upd_err:.2e})"
    if exact is None or not np.isfinite(upd_err):
        return upd_err, problem
    ref = exact()[1]
    ours, theirs = norm_error(got[1], ref), norm_error(want[1], ref)
    if ours <= NOISE_FACTOR * theirs:
        return upd_err, None
    return upd_err, f"{problem}; from the float64 update {ours:.2e}, torch float32's {theirs:.2e}"


def float64_reference(case: Case, torch_device: str) -> list[np.ndarray]:
    """The check outputs of torch eager in float64 (weights and float inputs cast): the exact answer that float32
    results are measured against when they disagree by more than the fixed bound."""
    model = copy.deepcopy(case.torch_model).double()
    x = case.x.astype(np.float64) if case.x.dtype.kind == "f" else case.x
    return TorchRunner(torch_device).prepare(dataclasses.replace(case, torch_model=model, x=x)).check()


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}"[:300]


def run_cell(
    runner: Runner,
    case: Case,
    want: list[np.ndarray],
    s: Settings,
    exact: Callable[[], list[np.ndarray]] | None = None,
) -> dict[str, Any]:
    """Prepare, check, and (only if the check passes) time one framework on one case; `exact` gives the float64
    check outputs when a training update needs them (see `_mismatch`)."""
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
    try:
        err, problem = _mismatch(mode, got, want, exact)
    except Exception as e:
        return {"status": "error", "note": "float64 reference: " + _short(e)}
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
            exact = functools.cache(functools.partial(float64_reference, case, torch_device))
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
                        else run_cell(runner, case, want, s, exact)
                    )
                    runner.release()
                cells.append({**base, **cell})
                if progress:
                    progress.advance(label)
                if cell["status"] in ("error", "mismatch"):
                    log(f"  {label}: {cell['status']}: {cell['note']}")
    return cells
