"""Model architectures written once against the torch.nn-compatible surface, instantiated with plait.nn (the
models in plait.models) or with torch.nn (plait.models.torch_reference, for side-by-side runs and tests).

Module names, nesting and constructor arguments follow torchvision's definitions, so the state_dict keys are
torchvision's: a torchvision checkpoint loads into the plait model with load_state_dict.
"""

from __future__ import annotations

import functools
from types import ModuleType, SimpleNamespace
from typing import Any


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


@functools.cache
def classes(nn: ModuleType) -> SimpleNamespace:
    """Every architecture as classes deriving from `nn.Module` of the given library (plait.nn or torch.nn)."""

    def conv_bn(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1, act: Any = None) -> Any:
        """torchvision's Conv2dNormActivation: Sequential(conv, bn, activation) -> keys .0, .1."""
        act = act or nn.ReLU6
        return nn.Sequential(
            nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
            act(inplace=True),
        )

    class AlexNet(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self, num_classes: int = 1000, dropout: float = 0.5):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=3, stride=2),
                nn.Conv2d(64, 192, kernel_size=5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=3, stride=2),
                nn.Conv2d(192, 384, kernel_size=3, padding=1), nn.ReLU(inplace=True),
                nn.Conv2d(384, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True),
                nn.Conv2d(256, 256, kernel_size=3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(kernel_size=3, stride=2),
            )  # fmt: skip
            self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
            self.classifier = nn.Sequential(
                nn.Dropout(p=dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(inplace=True),
                nn.Dropout(p=dropout), nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Linear(4096, num_classes),
            )  # fmt: skip

        def forward(self, x: Any) -> Any:
            return self.classifier(self.avgpool(self.features(x)).flatten(1))

    class VGG(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self, cfg: list[Any], num_classes: int = 1000, batch_norm: bool = False, dropout: float = 0.5):
            super().__init__()
            layers: list[Any] = []
            cin = 3
            for v in cfg:
                if v == "M":
                    layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                    continue
                layers.append(nn.Conv2d(cin, v, kernel_size=3, padding=1))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(v))
                layers.append(nn.ReLU(inplace=True))
                cin = v
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
            self.classifier = nn.Sequential(
                nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(p=dropout),
                nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(p=dropout), nn.Linear(4096, num_classes),
            )  # fmt: skip

        def forward(self, x: Any) -> Any:
            return self.classifier(self.avgpool(self.features(x)).flatten(1))

    class BasicBlock(nn.Module):  # type: ignore[name-defined,misc]
        expansion = 1

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Any = None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x: Any) -> Any:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + (self.downsample(x) if self.downsample is not None else x))

    class Bottleneck(nn.Module):  # type: ignore[name-defined,misc]
        """ResNet v1.5: the stride sits on the 3x3 convolution."""

        expansion = 4

        def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: Any = None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x: Any) -> Any:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (self.downsample(x) if self.downsample is not None else x))

    class ResNet(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self, block: Any, layers: list[int], num_classes: int = 1000):
            super().__init__()
            self.inplanes = 64
            self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = self._make_layer(block, 64, layers[0])
            self.layer2 = self._make_layer(block, 128, layers[1], stride=2)
            self.layer3 = self._make_layer(block, 256, layers[2], stride=2)
            self.layer4 = self._make_layer(block, 512, layers[3], stride=2)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(512 * block.expansion, num_classes)

        def _make_layer(self, block: Any, planes: int, blocks: int, stride: int = 1) -> Any:
            downsample = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                    nn.BatchNorm2d(planes * block.expansion),
                )
            layers = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * block.expansion
            layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
            return nn.Sequential(*layers)

        def forward(self, x: Any) -> Any:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(self.avgpool(x).flatten(1))

    class InvertedResidual(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int):
            super().__init__()
            hidden = round(inp * expand_ratio)
            self.use_res_connect = stride == 1 and inp == oup
            layers: list[Any] = []
            if expand_ratio != 1:
                layers.append(conv_bn(inp, hidden, k=1))
            layers += [
                conv_bn(hidden, hidden, stride=stride, groups=hidden),
                nn.Conv2d(hidden, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
            ]
            self.conv = nn.Sequential(*layers)

        def forward(self, x: Any) -> Any:
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, dropout: float = 0.2):
            super().__init__()
            settings = [
                [1, 16, 1, 1],
                [6, 24, 2, 2],
                [6, 32, 3, 2],
                [6, 64, 4, 2],
                [6, 96, 3, 1],
                [6, 160, 3, 2],
                [6, 320, 1, 1],
            ]
            cin = _make_divisible(32 * width_mult)
            self.last_channel = _make_divisible(1280 * max(1.0, width_mult))
            features: list[Any] = [conv_bn(3, cin, stride=2)]
            for t, c, n, s in settings:
                cout = _make_divisible(c * width_mult)
                for i in range(n):
                    features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                    cin = cout
            features.append(conv_bn(cin, self.last_channel, k=1))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))

        def forward(self, x: Any) -> Any:
            x = self.features(x)
            return self.classifier(x.mean((2, 3)))

    class CifarCNN(nn.Module):  # type: ignore[name-defined,misc]
        """A VGG-style CIFAR-10 network: three conv-BN-ReLU stages with max pooling, then a small classifier."""

        def __init__(self, num_classes: int = 10, width: int = 32, dropout: float = 0.3):
            super().__init__()

            def stage(cin: int, cout: int) -> list[Any]:
                return [
                    nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                    nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                    nn.MaxPool2d(2),
                ]  # fmt: skip

            w = width
            self.features = nn.Sequential(*stage(3, w), *stage(w, 2 * w), *stage(2 * w, 4 * w))
            self.classifier = nn.Sequential(
                nn.Flatten(),
                nn.Dropout(dropout),
                nn.Linear(4 * w * 4 * 4, 8 * w),
                nn.ReLU(inplace=True),
                nn.Linear(8 * w, num_classes),
            )

        def forward(self, x: Any) -> Any:
            return self.classifier(self.features(x))

    class GRUClassifier(nn.Module):  # type: ignore[name-defined,misc]
        """Sentiment classifier: embedding -> GRU (batch_first) -> linear on the last hidden state."""

        def __init__(
            self,
            vocab_size: int = 5000,
            embed_dim: int = 64,
            hidden_size: int = 128,
            num_classes: int = 2,
            num_layers: int = 1,
            bidirectional: bool = False,
        ):
            super().__init__()
            self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
            self.gru = nn.GRU(
                embed_dim, hidden_size, num_layers=num_layers, batch_first=True, bidirectional=bidirectional
            )
            self.fc = nn.Linear(hidden_size * (2 if bidirectional else 1), num_classes)
            self.bidirectional = bidirectional

        def forward(self, tokens: Any) -> Any:
            _, h = self.gru(self.embedding(tokens))
            last = h[-2:].permute(1, 0, 2).reshape(h.shape[1], -1) if self.bidirectional else h[-1]
            return self.fc(last)

    class DigitsCNN(nn.Module):  # type: ignore[name-defined,misc]
        """A small CNN for 8x8 digit images (scikit-learn's digits): used by examples/train_digits.py."""

        def __init__(self, num_classes: int = 10):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            )  # fmt: skip
            self.classifier = nn.Sequential(
                nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, num_classes)
            )

        def forward(self, x: Any) -> Any:
            return self.classifier(self.features(x))

    return SimpleNamespace(**{k: v for k, v in locals().items() if isinstance(v, type)})


VGG16_CFG = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


def builders(nn: ModuleType) -> dict[str, Any]:
    """Constructors by model name for one library: alexnet, resnet18, resnet50, vgg16, mobilenet_v2, ..."""
    c = classes(nn)
    return {
        "alexnet": lambda **kw: c.AlexNet(**kw),
        "resnet18": lambda **kw: c.ResNet(c.BasicBlock, [2, 2, 2, 2], **kw),
        "resnet50": lambda **kw: c.ResNet(c.Bottleneck, [3, 4, 6, 3], **kw),
        "vgg16": lambda **kw: c.VGG(VGG16_CFG, **kw),
        "mobilenet_v2": lambda **kw: c.MobileNetV2(**kw),
        "cifar_cnn": lambda **kw: c.CifarCNN(**kw),
        "gru_classifier": lambda **kw: c.GRUClassifier(**kw),
        "digits_cnn": lambda **kw: c.DigitsCNN(**kw),
    }
