"""The Microsoft benchmark tasks on small files in the real data sets' formats: accuracy reported per framework."""

from __future__ import annotations

from pathlib import Path

import pytest

from plait.bench import tasks
from plait.bench.matrix import Settings
from plait.bench.runners import MissingRunner, OnnxRuntimeRunner, TorchRunner
from tests.bench.conftest import write_cifar, write_imdb

pytest.importorskip("torch")


def test_training_tasks_on_real_formats(tmp_path: Path) -> None:
    ts = tasks.TaskSettings(
        cifar_path=str(write_cifar(tmp_path / "cifar", n=8)), imdb_path=str(write_imdb(tmp_path / "imdb.npz", n=8))
    )
    datasets = tasks.load_datasets(["cifar", "imdb"], ts, seed=0)
    runners = [TorchRunner(), OnnxRuntimeRunner(1), MissingRunner("tensorflow", "no_such_mod")]
    rows = tasks.run_tasks(["cifar", "imdb"], datasets, runners, Settings(batch=4), ts, "cpu", log=lambda s: None)
    by = {(r["task"], r["framework"]): r for r in rows}
    for task, n in (("cifar", 16), ("imdb", 8)):
        r = by[(task, "torch")]
        assert r["status"] == "ok" and r["train_samples"] == n and r["seconds"] > 0
        assert 0.0 <= r["accuracy"] <= 1.0 and r["data"].endswith(("cifar", "imdb.npz"))
        assert by[(task, "onnxruntime")]["status"] == "skipped"
        assert by[(task, "tensorflow")]["status"] == "skipped"


def test_generated_data_has_no_accuracy() -> None:
    ts = tasks.TaskSettings(train_samples=8, test_samples=4)
    datasets = tasks.load_datasets(["cifar"], ts, seed=0)
    rows = tasks.run_tasks(["cifar"], datasets, [TorchRunner()], Settings(batch=4), ts, "cpu", log=lambda s: None)
    assert rows[0]["status"] == "ok" and rows[0]["accuracy"] is None and rows[0]["data"] == "generated"
