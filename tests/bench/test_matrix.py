"""The matrix: every framework checked against PyTorch eager before it is timed; mismatches are never timed."""

from __future__ import annotations

import numpy as np
import pytest

from plait.bench import matrix
from plait.bench.models import BenchModel
from plait.bench.runners import (
    Case,
    MissingRunner,
    OnnxRuntimeRunner,
    PlaitOnnxRunner,
    PlaitRunner,
    Prepared,
    TorchRunner,
)

pytest.importorskip("torch")
FAST = matrix.Settings(warmup=1, iters=3)


class WrongRunner(TorchRunner):
    """PyTorch eager with its outputs scaled: a framework that computes the wrong thing."""

    def __init__(self) -> None:
        super().__init__()
        self.name = "wrong"
        self.timed = 0

    def prepare(self, case: Case) -> Prepared:
        p = super().prepare(case)

        def step() -> None:
            self.timed += 1

        return Prepared(lambda: [a * 1.5 for a in p.check()], step)


def test_matrix_checks_then_times(tiny: BenchModel) -> None:
    wrong = WrongRunner()
    runners = [
        TorchRunner(),
        PlaitRunner("cpu"),
        OnnxRuntimeRunner(1),
        PlaitOnnxRunner("cpu"),
        wrong,
        MissingRunner("tinygrad", "no_such_mod"),
    ]
    cells = matrix.run_matrix([tiny], ["infer-1", "train"], runners, FAST, "cpu", log=lambda s: None)
    by = {(c["mode"], c["framework"]): c for c in cells}
    assert len(cells) == 12
    assert by[("infer-1", "plait-onnx:cpu")]["status"] == "ok"
    for fw in ("torch", "plait:cpu"):
        for mode in ("infer-1", "train"):
            c = by[(mode, fw)]
            assert c["status"] == "ok", c
            assert c["iters"] == 3 and c["p25_ms"] <= c["median_ms"] <= c["p75_ms"] and len(c["samples_ms"]) == 3
    assert by[("infer-1", "onnxruntime")]["status"] == "ok"
    assert by[("train", "onnxruntime")]["status"] == "skipped"
    assert by[("train", "wrong")]["status"] == "mismatch" and by[("infer-1", "wrong")]["status"] == "mismatch"
    assert wrong.timed == 0 and "median_ms" not in by[("infer-1", "wrong")]
    assert by[("infer-1", "tinygrad")]["status"] == "skipped" and "not installed" in by[("infer-1", "tinygrad")]["note"]


def test_broken_model_is_an_error_cell(tiny: BenchModel) -> None:
    def broken() -> None:
        raise RuntimeError("cannot build")

    bad = BenchModel("broken", "image", (8,), 3, 4, 4, broken, tiny.plait_factory)
    cells = matrix.run_matrix([bad], ["infer-1"], [TorchRunner()], FAST, "cpu", log=lambda s: None)
    assert cells[0]["status"] == "error" and "cannot build" in cells[0]["note"]


def test_rel_error() -> None:
    a = np.array([1.0, -2.0, 4.0], np.float32)
    assert matrix.rel_error([a], [a]) == 0
    assert matrix.rel_error([a + 0.04], [a]) == pytest.approx(0.01)
    assert matrix.rel_error([a[:2]], [a]) == float("inf")
    assert matrix.rel_error([a * np.nan], [a]) == float("inf")


def test_update_check_measures_float32_noise_against_float64() -> None:
    """A training update further from torch's than the fixed bound passes only when it is within NOISE_FACTOR times
    torch float32's own distance from the float64 update; a wrong gradient (O(1) off) fails either way."""
    rng = np.random.default_rng(0)
    exact = rng.standard_normal(1000)
    torch32 = exact + 0.03 * np.linalg.norm(exact) / np.sqrt(1000) * rng.standard_normal(1000)
    ours = exact + 0.03 * np.linalg.norm(exact) / np.sqrt(1000) * rng.standard_normal(1000)
    loss = np.array(1.0)
    want, got = [loss, torch32], [loss, ours]
    err, problem = matrix._mismatch("train", got, want)
    assert err > matrix.TOLERANCES["param_update"] and problem is not None and "norm rel. error" in problem
    err, problem = matrix._mismatch("train", got, want, lambda: [loss, exact])
    assert problem is None and err == pytest.approx(matrix.norm_error(ours, torch32))
    wrong = [loss, exact * 1.5]
    _, problem = matrix._mismatch("train", wrong, want, lambda: [loss, exact])
    assert problem is not None and "float64" in problem
    assert matrix._mismatch("train", [loss, torch32 * (1 + 1e-3)], want)[1] is None


def test_float64_reference(tiny: BenchModel) -> None:
    """The float64 check outputs of torch: loss and update close to float32's, computed from the same weights."""
    import torch

    torch.manual_seed(0)
    model = tiny.torch_factory()
    x, y = tiny.inputs(4)
    case = Case(tiny, "train", 4, x, y, model)
    exact = matrix.float64_reference(case, "cpu")
    f32 = TorchRunner().prepare(case).check()
    assert exact[1].dtype == np.float64 and next(model.parameters()).dtype == torch.float32
    assert matrix.rel_error(f32[:1], exact[:1]) < 1e-5
    assert matrix.norm_error(f32[1], exact[1]) < 1e-4
