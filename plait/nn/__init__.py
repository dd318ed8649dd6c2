"""plait.nn: layers, losses and containers mirroring torch.nn (names, defaults, parameter names, state_dict keys).

>>> import plait
>>> net = plait.nn.Sequential(plait.nn.Linear(4, 8, device="cpu"), plait.nn.ReLU(), plait.nn.Linear(8, 2, device="cpu"))
>>> net(plait.Tensor.ones(3, 4, device="cpu")).shape
(3, 2)
"""

from plait.nn import functional, init
from plait.nn.init import manual_seed
from plait.nn.layers import (
    GELU,
    AdaptiveAvgPool2d,
    AvgPool2d,
    BatchNorm1d,
    BatchNorm2d,
    BCEWithLogitsLoss,
    Conv2d,
    CrossEntropyLoss,
    Dropout,
    Embedding,
    Flatten,
    GroupNorm,
    Hardsigmoid,
    Hardswish,
    Identity,
    LayerNorm,
    LeakyReLU,
    Linear,
    LogSoftmax,
    MaxPool2d,
    ModuleList,
    MSELoss,
    NLLLoss,
    ReLU,
    ReLU6,
    Sequential,
    Sigmoid,
    SiLU,
    Softmax,
    Tanh,
    Upsample,
)
from plait.nn.module import Module, Parameter, StateDictError
from plait.nn.rnn import GRU, LSTM
from plait.nn.serialization import load, save

__all__ = [
    "BCEWithLogitsLoss",
    "AdaptiveAvgPool2d",
    "AvgPool2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "Conv2d",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "Flatten",
    "GELU",
    "GRU",
    "GroupNorm",
    "Hardsigmoid",
    "Hardswish",
    "Identity",
    "LSTM",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LogSoftmax",
    "MSELoss",
    "MaxPool2d",
    "Module",
    "ModuleList",
    "NLLLoss",
    "Parameter",
    "ReLU",
    "ReLU6",
    "SiLU",
    "Sequential",
    "Sigmoid",
    "Softmax",
    "StateDictError",
    "Tanh",
    "Upsample",
    "functional",
    "init",
    "load",
    "manual_seed",
    "save",
]
