"""Fixtures for the benchmark's tests: a tiny model registered in the matrix, small data files in both formats."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plait.bench import models

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_WAIT_POLICY", "PLAIT_NUM_THREADS")


def _torch_tiny() -> Any:
    import torch

    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _plait_tiny(device: str) -> Any:
    import plait

    return plait.nn.Sequential(plait.nn.Linear(8, 16), plait.nn.ReLU(), plait.nn.Linear(16, 3)).to(device)


TINY = models.BenchModel("tiny", "image", (8,), 3, 4, 4, _torch_tiny, _plait_tiny)


@pytest.fixture
def tiny() -> models.BenchModel:
    models.register(TINY)
    return TINY


@pytest.fixture
def thread_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """`plait bench` sets thread variables for the whole process; put them back after the test."""
    for k in THREAD_VARS:
        monkeypatch.setenv(k, "1")


def write_cifar(folder: Path, n: int = 16, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("data_batch_1", "data_batch_2", "test_batch"):
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [b"img.png"] * n,
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return folder


def write_imdb(path: Path, n: int = 12, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    reviews = np.empty(n, dtype=object)
    reviews[:] = [rng.integers(1, 40000, rng.integers(0, 300)).tolist() for _ in range(n)]
    labels = rng.integers(0, 2, n)
    np.savez(path, x_train=reviews, y_train=labels, x_test=reviews, y_test=labels)
    return path
