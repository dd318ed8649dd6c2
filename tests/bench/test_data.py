"""Data loaders: CIFAR-10 python batches and Keras' imdb.npz, read without running anything a pickle names."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from plait.bench import data
from plait.bench.models import BenchError
from tests.bench.conftest import write_cifar, write_imdb


def test_cifar_batches(tmp_path: Path) -> None:
    ds = data.load_cifar10(write_cifar(tmp_path / "cifar", n=16))
    assert ds.x_train.shape == (32, 3, 32, 32) and ds.x_train.dtype == np.float32
    assert ds.y_train.shape == (32,) and ds.x_test.shape == (16, 3, 32, 32)
    assert set(np.unique(ds.y_train)) <= set(range(10))
    assert abs(float(ds.x_train.mean())) < 1.5


class _Evil:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("echo should-not-run",))


def test_cifar_refuses_foreign_globals(tmp_path: Path) -> None:
    folder = write_cifar(tmp_path / "cifar")
    (folder / "data_batch_2").write_bytes(pickle.dumps({b"data": _Evil(), b"labels": []}))
    with pytest.raises(BenchError, match=r"refusing to load (posix|nt)\.system"):
        data.load_cifar10(folder)


@pytest.mark.parametrize(
    "payload",
    [b"not a pickle", pickle.dumps([1, 2, 3]), pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]})],
)
def test_cifar_wrong_format(tmp_path: Path, payload: bytes) -> None:
    folder = write_cifar(tmp_path / "cifar")
    (folder / "test_batch").write_bytes(payload)
    with pytest.raises(BenchError, match="not a CIFAR-10 python batch"):
        data.load_cifar10(folder)


def test_cifar_missing(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="does not exist"):
        data.load_cifar10(tmp_path / "nowhere")
    with pytest.raises(BenchError, match="no data_batch"):
        data.load_cifar10(tmp_path)


def test_imdb_lists(tmp_path: Path) -> None:
    ds = data.load_imdb(write_imdb(tmp_path / "imdb.npz", n=12))
    assert ds.x_train.shape == (12, 150) and ds.x_train.dtype == np.int64
    assert ds.x_train.max() < data.IMDB_VOCAB and ds.x_train.min() >= 0
    assert ds.y_test.shape == (12,)


def test_imdb_padding_and_vocabulary(tmp_path: Path) -> None:
    reviews = np.empty(2, dtype=object)
    reviews[:] = [[5, 40000], list(range(1, 201))]
    np.savez(tmp_path / "i.npz", x_train=reviews, y_train=[0, 1], x_test=reviews, y_test=[1, 0])
    x = data.load_imdb(tmp_path / "i.npz").x_train
    assert x[0, -3:].tolist() == [data.IMDB_START, 5 + data.IMDB_INDEX_FROM, data.IMDB_OOV]
    assert (x[0, :-3] == 0).all()
    assert x[1, -1] == 200 + data.IMDB_INDEX_FROM  # truncation keeps the end of a long review


def test_imdb_padded_matrix(tmp_path: Path) -> None:
    x = np.random.default_rng(0).integers(0, 100, (4, 150))
    np.savez(tmp_path / "m.npz", x_train=x, y_train=np.zeros(4, int), x_test=x, y_test=np.ones(4, int))
    assert (data.load_imdb(tmp_path / "m.npz").x_train == x).all()


def test_imdb_wrong_format(tmp_path: Path) -> None:
    (tmp_path / "a.npz").write_bytes(b"plain text")
    with pytest.raises(BenchError, match=r"not an IMDB \.npz"):
        data.load_imdb(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", x_train=np.zeros((2, 3)))
    with pytest.raises(BenchError, match="missing"):
        data.load_imdb(tmp_path / "b.npz")
    with pytest.raises(BenchError, match="does not exist"):
        data.load_imdb(tmp_path / "c.npz")


def test_generated_shapes() -> None:
    c = data.generated_cifar10(8, 4)
    i = data.generated_imdb(8, 4)
    assert c.x_train.shape == (8, 3, 32, 32) and c.source == "generated"
    assert i.x_test.shape == (4, 150) and i.x_train.max() < data.IMDB_VOCAB
