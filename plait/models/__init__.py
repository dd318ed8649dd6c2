"""Model definitions in plait.nn: torchvision's alexnet, resnet18, resnet50, vgg16 and mobilenet_v2 (same
state_dict keys, so torchvision weights load), a VGG-style CIFAR-10 CNN, a GRU sentiment classifier and a small
digits CNN. plait.models.torch_reference builds the same architectures in PyTorch.

>>> import plait
>>> net = plait.models.resnet18(num_classes=10)
>>> "layer1.0.conv1.weight" in net.state_dict()
True
"""

from __future__ import annotations

from typing import Any

from plait import nn
from plait.models.architectures import builders, classes

_B = builders(nn)


def alexnet(**kw: Any) -> nn.Module:
    return _B["alexnet"](**kw)  # type: ignore[no-any-return]


def resnet18(**kw: Any) -> nn.Module:
    return _B["resnet18"](**kw)  # type: ignore[no-any-return]


def resnet50(**kw: Any) -> nn.Module:
    return _B["resnet50"](**kw)  # type: ignore[no-any-return]


def vgg16(**kw: Any) -> nn.Module:
    return _B["vgg16"](**kw)  # type: ignore[no-any-return]


def mobilenet_v2(**kw: Any) -> nn.Module:
    return _B["mobilenet_v2"](**kw)  # type: ignore[no-any-return]


def cifar_cnn(**kw: Any) -> nn.Module:
    """VGG-style CIFAR-10 CNN (3x32x32 inputs)."""
    return _B["cifar_cnn"](**kw)  # type: ignore[no-any-return]


def gru_classifier(**kw: Any) -> nn.Module:
    """Embedding + GRU + linear sentiment classifier over (batch, time) token ids."""
    return _B["gru_classifier"](**kw)  # type: ignore[no-any-return]


def digits_cnn(**kw: Any) -> nn.Module:
    """Small CNN for 1x8x8 digit images."""
    return _B["digits_cnn"](**kw)  # type: ignore[no-any-return]


MODELS = tuple(_B)

__all__ = [
    "MODELS",
    "alexnet",
    "classes",
    "cifar_cnn",
    "digits_cnn",
    "gru_classifier",
    "mobilenet_v2",
    "resnet18",
    "resnet50",
    "vgg16",
]
