"""The benchmark's models: each one a PyTorch definition and a plait twin with the same parameter names.

The PyTorch model is built once per run with a fixed seed; every other framework gets its weights from it (plait
through `load_state_dict`, ONNX Runtime through an ONNX export), so every framework computes the same function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from plait.errors import PlaitError


class BenchError(PlaitError):
    """A user error in a `plait bench` invocation (unknown name, missing or malformed data file)."""


@dataclass(frozen=True)
class BenchModel:
    """One model of the matrix. `kind` is 'image' (float NCHW input) or 'tokens' (int64 ids, `vocab` of them)."""

    name: str
    kind: str
    sample_shape: tuple[int, ...]
    num_classes: int
    batch: int  # the larger inference batch and the training batch
    quick_batch: int
    torch_factory: Callable[[], Any]
    plait_factory: Callable[[str], Any]
    vocab: int = 0
    note: str = ""
    modes: tuple[str, ...] = ("infer-1", "infer-batch", "train")  # the modes this model runs in the matrix

    def inputs(self, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Generated inputs and class labels, the same for every framework."""
        rng = np.random.default_rng(seed)
        x: np.ndarray
        if self.kind == "tokens":
            x = rng.integers(0, self.vocab, size=(batch, *self.sample_shape), dtype=np.int64)
        else:
            x = rng.standard_normal((batch, *self.sample_shape), dtype=np.float32)
        y = rng.integers(0, self.num_classes, size=(batch,), dtype=np.int64)
        return x, y


def _torch_twin(name: str, **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        from plait.models import torch_reference

        return torch_reference.build(name, **kw)

    return make


def _plait_model(name: str, **kw: Any) -> Callable[[str], Any]:
    def make(device: str) -> Any:
        import plait.models

        return getattr(plait.models, name)(**kw).to(device)

    return make


def _imagenet(name: str, batch: int, quick_batch: int) -> BenchModel:
    return BenchModel(name, "image", (3, 224, 224), 1000, batch, quick_batch, _torch_twin(name), _plait_model(name))


_GRU = {"vocab_size": 30000, "embed_dim": 125, "hidden_size": 100, "num_classes": 2}  # the Microsoft benchmark's


MODELS: dict[str, BenchModel] = {
    m.name: m
    for m in (
        _imagenet("alexnet", 32, 8),
        _imagenet("resnet18", 32, 8),
        _imagenet("resnet50", 32, 8),
        _imagenet("vgg16", 16, 4),
        _imagenet("mobilenet_v2", 32, 8),
        BenchModel(
            "cifar_cnn",
            "image",
            (3, 32, 32),
            10,
            64,
            64,
            _torch_twin("cifar_cnn"),
            _plait_model("cifar_cnn"),
            note="VGG-style CIFAR-10 CNN",
        ),
        BenchModel(
            "gru",
            "tokens",
            (150,),
            2,
            64,
            32,
            _torch_twin("gru_classifier", **_GRU),
            _plait_model("gru_classifier", **_GRU),
            vocab=30000,
            note="GRU sentiment classifier (vocabulary 30k, embedding 125, hidden 100, sequences of 150)",
        ),
    )
}
QUICK_MODELS = ("resnet18", "mobilenet_v2", "cifar_cnn", "gru")
# In the quick matrix the 224x224 models skip the training step: on a 2-core CPU plait's first compile of a ResNet's
# backward pass alone takes minutes (`plait bench --models resnet18 --modes train` runs it).
QUICK_MODES = {"resnet18": ("infer-1", "infer-batch"), "mobilenet_v2": ("infer-1", "infer-batch")}


def register(model: BenchModel) -> None:
    """Add a model to the matrix (tests register tiny ones)."""
    MODELS[model.name] = model


def get(name: str) -> BenchModel:
    if name not in MODELS:
        raise BenchError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name]
