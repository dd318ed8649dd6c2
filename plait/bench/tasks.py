"""The three tasks of Microsoft's DeepLearningFrameworks benchmark, per framework:

- cifar: train the VGG-style CNN on CIFAR-10(-shaped) data, seconds per epoch;
- resnet50-features: ResNet-50 without its classifier over generated images, seconds per 1000 images;
- imdb: train the GRU classifier on IMDB(-shaped) data (vocabulary 30k, sequences of 150), seconds per epoch.

Each framework first passes the same check as the matrix (one step from the same weights, compared with PyTorch
eager). With real data the report also gives test accuracy per framework.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from plait.bench import data, models
from plait.bench.matrix import Settings, _mismatch, _short
from plait.bench.runners import Case, Runner, TorchRunner

TASKS = ("cifar", "resnet50-features", "imdb")


@dataclass
class TaskSettings:
    cifar_path: str | None = None
    imdb_path: str | None = None
    train_samples: int | None = None  # cap on training samples per epoch (default: 1024 generated, all real)
    test_samples: int = 256  # generated test set size
    feature_images: int = 256
    feature_batch: int = 32
    epochs: int = 1


def _batches(n: int, batch: int) -> list[slice]:
    return [slice(i, i + batch) for i in range(0, n - batch + 1, batch)]


def _accuracy(predict: Any, x: np.ndarray, y: np.ndarray, batch: int) -> float:
    """Test accuracy, the last partial batch padded to `batch` rows (plans are compiled for one shape)."""
    correct = 0
    for i in range(0, len(x), batch):
        xb = x[i : i + batch]
        n = len(xb)
        if n < batch:
            xb = np.concatenate([xb, np.zeros((batch - n, *xb.shape[1:]), xb.dtype)])
        correct += int((predict(xb)[:n].argmax(axis=1) == y[i : i + n]).sum())
    return correct / max(len(x), 1)


def _check(runner: Runner, case: Case, want: list[np.ndarray]) -> str | None:
    try:
        got = runner.prepare(case).check()
    except Exception as e:
        return _short(e)
    return _mismatch(case.mode, got, want)[1]


def _train_task(
    name: str,
    spec: models.BenchModel,
    ds: data.Dataset,
    runners: list[Runner],
    s: Settings,
    ts: TaskSettings,
    torch_device: str,
) -> list[dict[str, Any]]:
    import torch

    torch.manual_seed(s.seed)
    ref = spec.torch_factory()
    batch = s.batch or spec.batch
    n = len(ds.x_train) if ts.train_samples is None else min(ts.train_samples, len(ds.x_train))
    slices = _batches(n, batch)
    if not slices:
        return [{"task": name, "framework": "-", "status": "error", "note": f"fewer than {batch} training samples"}]
    case = Case(spec, "train", batch, ds.x_train[:batch], ds.y_train[:batch], ref, s.lr)
    want = TorchRunner(torch_device).prepare(case).check()
    base = {
        "task": name,
        "data": ds.source,
        "batch": batch,
        "train_samples": len(slices) * batch,
        "epochs": ts.epochs,
        "unit": "per epoch",
    }
    out = []
    for r in runners:
        row: dict[str, Any] = {**base, "framework": r.name, "accuracy": None}
        why = r.unavailable() or ("" if "train" in r.modes else f"{r.name} does not train")
        problem = None if why else _check(r, case, want)
        if why or problem:
            out.append({**row, "status": "skipped" if why else "failed", "note": why or problem})
            continue
        try:
            trainer = r.trainer(case)
            trainer.step(ds.x_train[:batch], ds.y_train[:batch])  # warm-up: compilation is not an epoch's work
            r.sync()
            t0 = time.perf_counter()
            for _ in range(ts.epochs):
                for sl in slices:
                    trainer.step(ds.x_train[sl], ds.y_train[sl])
            r.sync()
            seconds = (time.perf_counter() - t0) / ts.epochs
            if ds.source != "generated":
                row["accuracy"] = _accuracy(trainer.predict, ds.x_test, ds.y_test, batch)
        except Exception as e:
            out.append({**row, "status": "error", "note": _short(e)})
            continue
        out.append({**row, "status": "ok", "seconds": seconds, "samples_per_s": len(slices) * batch / seconds})
    return out


def _features_model(spec: models.BenchModel) -> models.BenchModel:
    """ResNet-50 with its classifier replaced by Identity: 2048 features per image."""

    def torch_factory() -> Any:
        import torch

        m = spec.torch_factory()
        m.fc = torch.nn.Identity()
        return m

    def plait_factory(device: str) -> Any:
        import plait

        m = spec.plait_factory(device)
        m.fc = plait.nn.Identity()
        return m

    return dataclasses.replace(
        spec, name="resnet50_features", num_classes=2048, torch_factory=torch_factory, plait_factory=plait_factory
    )


def _features_task(runners: list[Runner], s: Settings, ts: TaskSettings, torch_device: str) -> list[dict[str, Any]]:
    import torch

    spec = _features_model(models.get("resnet50"))
    torch.manual_seed(s.seed)
    ref = spec.torch_factory()
    batch = ts.feature_batch
    n = max(ts.feature_images // batch, 1) * batch
    images = np.random.default_rng(s.seed).standard_normal((n, 3, 224, 224), dtype=np.float32)
    case = Case(spec, "infer", batch, images[:batch], np.zeros(batch, np.int64), ref, s.lr)
    want = TorchRunner(torch_device).prepare(case).check()
    base = {"task": "resnet50-features", "data": "generated", "batch": batch, "images": n, "unit": "per 1000 images"}
    out = []
    for r in runners:
        row: dict[str, Any] = {**base, "framework": r.name, "accuracy": None}
        why = r.unavailable() or ("" if "infer" in r.modes else f"{r.name} does not run inference")
        problem = None if why else _check(r, case, want)
        if why or problem:
            out.append({**row, "status": "skipped" if why else "failed", "note": why or problem})
            continue
        try:
            predict = r.predictor(case)
            predict(images[:batch])
            r.sync()
            t0 = time.perf_counter()
            for sl in _batches(n, batch):
                predict(images[sl])
            r.sync()
            seconds = time.perf_counter() - t0
        except Exception as e:
            out.append({**row, "status": "error", "note": _short(e)})
            continue
        out.append({**row, "status": "ok", "seconds": seconds * 1000 / n, "samples_per_s": n / seconds})
    return out


def load_datasets(names: list[str], ts: TaskSettings, seed: int) -> dict[str, data.Dataset]:
    """Read (or generate) every data set the chosen tasks need, before anything is timed: a bad path fails early."""
    n_gen = ts.train_samples or 1024
    out = {}
    if "cifar" in names:
        out["cifar"] = (
            data.load_cifar10(ts.cifar_path) if ts.cifar_path else data.generated_cifar10(n_gen, ts.test_samples, seed)
        )
    if "imdb" in names:
        out["imdb"] = (
            data.load_imdb(ts.imdb_path) if ts.imdb_path else data.generated_imdb(n_gen, ts.test_samples, seed)
        )
    return out


def run_tasks(
    names: list[str],
    datasets: dict[str, data.Dataset],
    runners: list[Runner],
    s: Settings,
    ts: TaskSettings,
    torch_device: str,
    log: Any = print,
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in names:
        log(f"plait bench: task {name}")
        if name == "resnet50-features":
            rows = _features_task(runners, s, ts, torch_device)
        else:
            spec = models.get("cifar_cnn" if name == "cifar" else "gru")
            rows = _train_task(name, spec, datasets[name], runners, s, ts, torch_device)
        for r in rows:
            log(
                f"  {r['framework']}: {r['status']}"
                + (f" {r['seconds']:.2f} s {r['unit']}" if r["status"] == "ok" else f" ({r.get('note', '')})")
            )
        out += rows
    return out
