"""Networks outside the benchmark CNNs, built here with torch.nn, exported by torch.onnx.export (opsets 17 and 18)
and run by plait and ONNX Runtime on the same input: a transformer encoder with a padding mask, recurrent taggers,
a small U-Net, a squeeze-excitation block, an embedding MLP and max pooling that returns its indices. Sizes are
small so that each compiles quickly.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.onnx.conftest import compare_with_ort as _compare
from tests.onnx.conftest import export


class MaskedEncoder(nn.Module):
    """Token embedding + learned positions, a 2-layer batch-first TransformerEncoder that ignores padded tokens
    (src_key_padding_mask), and a classifier over the mean of the real tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(40, 16)
        self.pos = nn.Parameter(torch.randn(1, 9, 16) * 0.1)
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 3)

    def forward(self, tokens: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        h = self.enc(self.emb(tokens) + self.pos[:, : tokens.shape[1]], src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1))


@pytest.mark.parametrize("opset", [17, 18])
def test_transformer_encoder_with_padding_mask(model_device: str, opset: int) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 40, (3, 9))
    lengths = torch.tensor([9, 6, 2])
    pad = torch.arange(9)[None, :] >= lengths[:, None]
    model = export(MaskedEncoder(), (tokens, pad), opset=opset)
    _compare(model, {"input0": tokens.numpy(), "input1": pad.numpy()}, model_device)


class Tagger(nn.Module):
    """Embedding, a bidirectional recurrent layer (GRU or 2-layer LSTM) and a per-token tag classifier."""

    def __init__(self, cell: str) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 12)
        rnn = nn.GRU if cell == "gru" else nn.LSTM
        self.rnn = rnn(12, 10, num_layers=1 if cell == "gru" else 2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(20, 5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.emb(tokens))
        return torch.log_softmax(self.out(h), -1)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_bidirectional_tagger(model_device: str, cell: str) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 30, (2, 7))
    model = export(Tagger(cell), (tokens,))
    _compare(model, {"input0": tokens.numpy()}, model_device)


class TinyUNet(nn.Module):
    """Two down steps (conv + BN + ReLU, max pool) and two up steps (ConvTranspose2d, then bilinear and nearest
    Upsample) with concatenated skip connections."""

    def __init__(self) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Module:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

        self.d1, self.d2, self.mid = block(3, 8), block(8, 16), block(16, 16)
        self.pool = nn.MaxPool2d(2)
        self.up1 = nn.ConvTranspose2d(16, 16, 2, stride=2)
        self.u1 = block(32, 8)
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.u2 = block(16, 8)
        self.up3 = nn.Upsample(scale_factor=2, mode="nearest")
        self.out = nn.Conv2d(8, 2, 1)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.running_mean, -0.3, 0.3)
                nn.init.uniform_(m.running_var, 0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.d1(x)  # 16x16
        s2 = self.d2(self.pool(s1))  # 8x8
        m = self.mid(self.pool(s2))  # 4x4
        h = self.u1(torch.cat([self.up1(m), s2], 1))  # 8x8
        h = self.u2(torch.cat([self.up2(h), s1], 1))  # 16x16
        return self.out(self.up3(h))  # 32x32


def test_small_unet(model_device: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    model = export(TinyUNet(), (x,), opset=18)
    _compare(model, {"input0": x.numpy()}, model_device)


class SEBlock(nn.Module):
    """MobileNetV3-style inverted residual: 1x1 expand, depthwise 3x3 (stride 2 and 1), hardswish,
    squeeze-excitation (global pool, two 1x1 convs, hardsigmoid gate) and a 1x1 projection."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = nn.Conv2d(8, 24, 1)
        self.dw1 = nn.Conv2d(24, 24, 3, stride=2, padding=1, groups=24)
        self.dw2 = nn.Conv2d(24, 24, 5, padding=2, groups=24)
        self.se = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(24, 6, 1), nn.ReLU(), nn.Conv2d(6, 24, 1), nn.Hardsigmoid()
        )
        self.project = nn.Conv2d(24, 8, 1)
        self.act = nn.Hardswish()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.dw1(self.act(self.expand(x))))
        h = self.act(self.dw2(h)) + h
        h = h * self.se(h)
        return self.project(h)


def test_squeeze_excitation_depthwise_hardswish(model_device: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 15, 15)
    model = export(SEBlock(), (x,), dynamic_batch=True)
    _compare(model, {"input0": x.numpy()}, model_device)


class EmbeddingMLP(nn.Module):
    """Two embedding tables summed, LayerNorm, a GELU (tanh approximation) MLP with a residual, a mean pool."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(64, 24)
        self.seg = nn.Embedding(2, 24)
        self.norm = nn.LayerNorm(24)
        self.mlp = nn.Sequential(nn.Linear(24, 48), nn.GELU(approximate="tanh"), nn.Linear(48, 24))
        self.head = nn.Linear(24, 4)

    def forward(self, tokens: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.tok(tokens) + self.seg(segments))
        h = h + self.mlp(h)
        return self.head(nn.functional.gelu(h).mean(1))


@pytest.mark.parametrize("opset", [17, 18])
def test_embedding_layernorm_gelu_mlp(model_device: str, opset: int) -> None:
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (3, 10))
    segments = (torch.arange(10) >= 5).long().expand(3, 10).contiguous()
    model = export(EmbeddingMLP(), (tokens, segments), opset=opset)
    _compare(model, {"input0": tokens.numpy(), "input1": segments.numpy()}, model_device)


class PoolWithIndices(nn.Module):
    """An encoder whose max pooling also returns where each maximum was (PyTorch's per-plane indices, which the
    exporter derives from ONNX MaxPool's Indices output); the features go on through a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1, return_indices=True)
        self.mid = nn.Conv2d(6, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h, idx = self.pool(torch.relu(self.enc(x)))
        return self.mid(h), idx


def test_max_pool_returning_indices(model_device: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 12)
    model = export(PoolWithIndices(), (x,), names=(["x"], ["y", "idx"]))
    _compare(model, {"x": x.numpy()}, model_device)
