"""Real models exported from PyTorch to ONNX in the test, run by plait and compared with ONNX Runtime.

The five benchmark CNNs run on `cpu` only (each is a few hundred kernels to compile; the OpenCL path is covered by
the small CNN and the GRU classifier, which run on every device).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plait.models import torch_reference
from plait.onnx import InferenceSession
from tests.onnx.conftest import compare_with_ort as _compare
from tests.onnx.conftest import export, ort_run

# name -> input resolution: alexnet and vgg16 keep 224 (their adaptive pools must divide evenly to be exported)
CNNS = {"alexnet": 224, "resnet18": 64, "resnet50": 64, "vgg16": 224, "mobilenet_v2": 64}


@pytest.mark.parametrize("name", list(CNNS))
def test_benchmark_cnn_matches_onnxruntime(name: str) -> None:
    torch.manual_seed(0)
    net = torch_reference.build(name, num_classes=100)
    size = CNNS[name]
    x = torch.randn(1, 3, size, size)
    model = export(net, (x,), dynamic_batch=True)
    _compare(model, {"input0": x.numpy()}, "cpu")


def test_gru_classifier_matches_onnxruntime(model_device: str) -> None:
    torch.manual_seed(0)
    net = torch_reference.build("gru_classifier", vocab_size=500, embed_dim=32, hidden_size=48)
    tokens = torch.randint(0, 500, (4, 12))
    model = export(net, (tokens,))
    _compare(model, {"input0": tokens.numpy()}, model_device)


class SmallCNN(torch.nn.Module):
    """Conv (grouped, strided, asymmetric padding), BN, ReLU6, max/avg pool, residual add, global pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.pool = torch.nn.MaxPool2d(3, 2, padding=1)
        self.avg = torch.nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False)
        self.fc = torch.nn.Linear(16, 5)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.relu6(self.bn(self.c1(x)))
        h = h + self.dw(h)
        h = self.avg(self.pool(self.c2(h)))
        return torch.softmax(self.fc(h.mean((2, 3))), -1)


def test_small_cnn_with_symbolic_batch(device: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 17, 17)
    model = export(SmallCNN(), (x,), dynamic_batch=True)
    sess = InferenceSession(model, device=device)
    assert sess.get_inputs()[0].shape == ["batch", 3, 17, 17]
    for batch in (2, 3):
        xb = torch.randn(batch, 3, 17, 17).numpy()
        got = sess.run(None, {"input0": xb})[0]
        np.testing.assert_allclose(got, ort_run(model, {"input0": xb})[0], rtol=1e-4, atol=1e-5)


class TinyTransformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layer(self.emb(t)))


def test_tiny_transformer_matches_onnxruntime(device: str) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 50, (2, 7))
    model = export(TinyTransformer(), (tokens,))
    _compare(model, {"input0": tokens.numpy()}, device)


def test_lstm_matches_onnxruntime(model_device: str) -> None:
    torch.manual_seed(0)
    net = torch.nn.LSTM(6, 10, num_layers=2, bidirectional=True)
    x = torch.randn(5, 3, 6)
    model = export(net, (x,), names=(["x"], ["y", "h", "c"]))
    _compare(model, {"x": x.numpy()}, model_device)
