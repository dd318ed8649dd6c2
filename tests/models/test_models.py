"""Model definitions: torchvision state_dict keys, forward against the PyTorch reference, and one SGD step of
resnet18 giving the same loss and updated parameters as PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
from plait.models.torch_reference import build


@pytest.mark.parametrize(
    "name", ["alexnet", "vgg16", "resnet18", "resnet50", "mobilenet_v2", "cifar_cnn", "gru_classifier"]
)
def test_state_dict_keys_and_shapes_match_reference(name: str) -> None:
    kw = {"num_classes": 10}
    ref = {k: tuple(v.shape) for k, v in build(name, **kw).state_dict().items()}
    got = {k: v.shape for k, v in getattr(plait.models, name)(**kw).state_dict().items()}
    assert list(got) == list(ref)
    assert got == ref


@pytest.mark.parametrize(
    "name,shape", [("mobilenet_v2", (1, 3, 32, 32)), ("cifar_cnn", (2, 3, 32, 32)), ("alexnet", (1, 3, 63, 63))]
)
def test_forward_matches_reference(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    t = build(name, num_classes=10).eval()
    p = getattr(plait.models, name)(num_classes=10).eval()
    p.load_state_dict(t.state_dict())
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(
        p(plait.tensor(x, device=next(iter(p.parameters())).device)).numpy(),
        t(torch.tensor(x)).detach().numpy(),
        rtol=1e-3,
        atol=1e-5,
    )


def test_gru_classifier_matches_reference() -> None:
    torch.manual_seed(0)
    t = build("gru_classifier", vocab_size=50, embed_dim=8, hidden_size=12)
    p = plait.models.gru_classifier(vocab_size=50, embed_dim=8, hidden_size=12)
    p.load_state_dict(t.state_dict())
    tok = np.random.default_rng(0).integers(0, 50, (3, 6))
    y = np.array([0, 1, 1])
    lp = plait.nn.functional.cross_entropy(p(plait.tensor(tok)), plait.tensor(y))
    lt = torch.nn.functional.cross_entropy(t(torch.tensor(tok)), torch.tensor(y))
    lp.backward()
    lt.backward()
    np.testing.assert_allclose(lp.item(), lt.item(), rtol=1e-5)
    for (k, a), (_, b) in zip(p.named_parameters(), t.named_parameters(), strict=True):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-3, atol=1e-6, err_msg=k)


def test_resnet18_sgd_step_matches_torch(model_device: str) -> None:
    device = model_device
    torch.manual_seed(0)
    t = build("resnet18", num_classes=10)
    p = plait.models.resnet18(num_classes=10)
    p.load_state_dict(t.state_dict())
    p.to(device)
    before = {k: v.numpy().copy() for k, v in t.state_dict().items()}
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 3, 64, 64)).astype(np.float32), np.array([3, 7])
    po = plait.optim.SGD(p.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    to = torch.optim.SGD(t.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    lp = plait.nn.functional.cross_entropy(p(plait.tensor(x, device=device)), plait.tensor(y, device=device))
    lt = torch.nn.functional.cross_entropy(t(torch.tensor(x)), torch.tensor(y))
    lp.backward()
    lt.backward()
    po.step()
    to.step()
    # batch 2 through BatchNorm amplifies float32 summation-order differences, hence the loss tolerance
    np.testing.assert_allclose(lp.item(), lt.item(), rtol=2e-3)
    ref = t.state_dict()
    for k, v in p.state_dict().items():
        if k.endswith("num_batches_tracked"):
            assert v.item() == ref[k].item() == 1
            continue
        got, want = v.numpy() - before[k], ref[k].numpy() - before[k]  # the update itself, not the weights
        np.testing.assert_allclose(got, want, rtol=5e-2, atol=2e-2 * np.abs(want).max() + 1e-7, err_msg=k)
