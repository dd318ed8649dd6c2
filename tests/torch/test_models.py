"""torchvision-style nets and the GRU classifier through torch.compile(backend="plait"), against eager PyTorch.

Small images keep the suite fast (the 224x224 set runs in benchmarks/bench_torch_compile.py). The big nets run at
batch 1 and 2; batch 16 runs for the GRU classifier and resnet18.
"""

from __future__ import annotations

import copy

import pytest
import torch

from plait.models import torch_reference
from tests.conftest import MODEL_DEVICES
from tests.torch.helpers import assert_close, compile_plait, run_no_fallback

IMAGE = {"alexnet": 64, "resnet18": 32, "resnet50": 32, "vgg16": 32, "mobilenet_v2": 32}


def _randomise_bn(net: torch.nn.Module) -> None:
    """Non-trivial running statistics, so eval-mode batch norm is really tested."""
    g = torch.Generator().manual_seed(3)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)


# every net at batch 1 on the first device (cpu here; the GPU when PLAIT_TEST_DEVICES names it), the two cheapest
# also at batch 2 (test_resnet18_batch_16 covers a larger batch); on the other devices (PoCL here, which compiles
# kernels slowly on 2 cores) resnet18 and mobilenet_v2 at batch 1
CASES = [(n, b, MODEL_DEVICES[0]) for n in sorted(IMAGE) for b in (1, 2) if b == 1 or n in ("alexnet", "resnet18")] + [
    (n, 1, d) for d in MODEL_DEVICES[1:] for n in ("mobilenet_v2", "resnet18")
]


@pytest.mark.parametrize(("name", "batch", "device"), CASES)
def test_vision_inference_matches_eager(name: str, batch: int, device: str) -> None:
    net = torch_reference.build(name, num_classes=10).eval()
    with torch.no_grad():
        _randomise_bn(net)
    x = torch.randn(batch, 3, IMAGE[name], IMAGE[name])
    compiled = compile_plait(net, device)
    with torch.no_grad():
        got = run_no_fallback(compiled, x)
        want = net(x)
    assert_close(got, want, rtol=1e-3, atol=1e-3, what=f"{name} batch {batch} on {device}")


@pytest.mark.parametrize("batch", [1, 16])
def test_resnet18_batch_16(batch: int, model_device: str) -> None:
    device = model_device
    net = torch_reference.build("resnet18", num_classes=10).eval()
    x = torch.randn(batch, 3, 32, 32)
    with torch.no_grad():
        assert_close(run_no_fallback(compile_plait(net, device), x), net(x), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("batch", [1, 16])
def test_gru_classifier_matches_eager(batch: int, model_device: str) -> None:
    device = model_device
    net = torch_reference.build("gru_classifier", vocab_size=100, embed_dim=16, hidden_size=24).eval()
    tokens = torch.randint(0, 100, (batch, 12))
    with torch.no_grad():
        got = run_no_fallback(compile_plait(net, device), tokens)
        want = net(tokens)
    assert_close(got, want, what=f"gru_classifier batch {batch} on {device}")


def test_gru_classifier_training_matches_eager(model_device: str) -> None:
    device = model_device
    net = torch_reference.build("gru_classifier", vocab_size=50, embed_dim=8, hidden_size=12)
    ref = copy.deepcopy(net)
    compiled = compile_plait(net, device)
    opt, ref_opt = torch.optim.SGD(net.parameters(), lr=0.5), torch.optim.SGD(ref.parameters(), lr=0.5)
    tokens, labels = torch.randint(0, 50, (4, 7)), torch.randint(0, 2, (4,))
    for step in range(3):
        loss = torch.nn.functional.cross_entropy(run_no_fallback(compiled, tokens), labels)
        ref_loss = torch.nn.functional.cross_entropy(ref(tokens), labels)
        assert abs(loss.item() - ref_loss.item()) < 1e-4, f"step {step}: {loss.item()} vs {ref_loss.item()}"
        for o, lo in ((opt, loss), (ref_opt, ref_loss)):
            o.zero_grad()
            lo.backward()
            o.step()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        assert_close(p, q, what=f"parameter {name} after 3 steps")
