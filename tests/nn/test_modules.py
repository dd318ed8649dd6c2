"""plait.nn modules, state dicts, safetensors, optimizers and schedules against torch.nn / torch.optim."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import plait
import plait.nn as nn


def _mlp_pair(device: str) -> tuple[nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    t = torch.nn.Sequential(
        torch.nn.Linear(6, 8, bias=False), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )
    p = nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).to(device)
    p.load_state_dict(t.state_dict())
    return p, t


OPTIMIZERS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "dampening": 0.0}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.01}),
    ("AdamW", {"lr": 0.01}),
]


@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)])
def test_optimizer_matches_torch(name: str, kw: dict[str, Any], device: str) -> None:
    p, t = _mlp_pair(device)
    po, to = getattr(plait.optim, name)(p.parameters(), **kw), getattr(torch.optim, name)(t.parameters(), **kw)
    ps = plait.optim.lr_scheduler.CosineAnnealingLR(po, T_max=4)
    ts = torch.optim.lr_scheduler.CosineAnnealingLR(to, T_max=4)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x, y = rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)
        lp = nn.functional.cross_entropy(p(plait.tensor(x, device=device)), plait.tensor(y, device=device))
        lt = torch.nn.functional.cross_entropy(t(torch.tensor(x)), torch.tensor(y))
        po.zero_grad()
        to.zero_grad()
        lp.backward()
        lt.backward()
        po.step()
        to.step()
        ps.step()
        ts.step()
        np.testing.assert_allclose(lp.item(), lt.item(), rtol=1e-5)
    assert ps.get_last_lr() == pytest.approx(ts.get_last_lr())
    ref = t.state_dict()
    for k, v in p.state_dict().items():
        np.testing.assert_allclose(v.numpy(), ref[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


def test_step_lr_matches_torch() -> None:
    p, t = _mlp_pair("cpu")
    po, to = plait.optim.SGD(p.parameters(), lr=1.0), torch.optim.SGD(t.parameters(), lr=1.0)
    ps, ts = plait.optim.lr_scheduler.StepLR(po, 2, 0.5), torch.optim.lr_scheduler.StepLR(to, 2, 0.5)
    for _ in range(5):
        to.step()
        ps.step()
        ts.step()
        assert ps.get_last_lr() == pytest.approx(ts.get_last_lr())


def test_batchnorm_running_stats_and_eval(device: str) -> None:
    torch.manual_seed(0)
    t = torch.nn.BatchNorm2d(3, momentum=0.2)
    p = nn.BatchNorm2d(3, momentum=0.2).to(device)
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32) * 2 + 1
        np.testing.assert_allclose(
            p(plait.tensor(x, device=device)).numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5
        )
    sd = p.state_dict()
    for k, v in t.state_dict().items():
        np.testing.assert_allclose(sd[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6, err_msg=k)
    p.eval()
    t.eval()
    assert not p.training
    np.testing.assert_allclose(
        p(plait.tensor(x, device=device)).numpy(), t(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("cls", ["GRU", "LSTM"])
def test_rnn_matches_torch(cls: str, device: str) -> None:
    torch.manual_seed(0)
    t = getattr(torch.nn, cls)(3, 4, num_layers=2, bidirectional=True, batch_first=True)
    p = getattr(nn, cls)(3, 4, num_layers=2, bidirectional=True, batch_first=True).to(device)
    p.load_state_dict(t.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 3, 3)).astype(np.float32)
    xp, xt = plait.tensor(x, device=device, requires_grad=True), torch.tensor(x, requires_grad=True)
    (op, hp), (ot, ht) = p(xp), t(xt)
    hp, ht = (hp[0], ht[0]) if cls == "LSTM" else (hp, ht)
    np.testing.assert_allclose(op.numpy(), ot.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(hp.numpy(), ht.detach().numpy(), rtol=1e-4, atol=1e-5)
    w = np.random.default_rng(1).standard_normal(ot.shape).astype(np.float32)
    ((op * plait.tensor(w, device=device)).sum() + hp.sum()).backward()
    ((ot * torch.tensor(w)).sum() + ht.sum()).backward()
    np.testing.assert_allclose(xp.grad.numpy(), xt.grad.numpy(), rtol=1e-3, atol=1e-5)
    for (name, a), (_, b) in zip(p.named_parameters(), t.named_parameters(), strict=True):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=name)


def test_load_state_dict_errors_load_nothing() -> None:
    p, t = _mlp_pair("cpu")
    before = {k: v.numpy().copy() for k, v in p.state_dict().items()}
    good = {k: v.numpy() * 0 + 7 for k, v in t.state_dict().items()}
    bad_shape = dict(good, **{"3.weight": np.zeros((3, 9), np.float32)})
    with pytest.raises(plait.PlaitError, match=r"3\.weight.*\(3, 9\)"):
        p.load_state_dict(bad_shape)
    missing = {k: v for k, v in good.items() if k != "1.running_var"}
    with pytest.raises(nn.StateDictError, match=r"missing keys \['1\.running_var'\]"):
        p.load_state_dict(missing)
    with pytest.raises(nn.StateDictError, match=r"unexpected keys.*extra"):
        p.load_state_dict(dict(good, extra=np.zeros(1, np.float32)))
    for k, v in p.state_dict().items():  # nothing was half-loaded
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)
    assert p.load_state_dict(missing, strict=False) == (["1.running_var"], [])


def test_safetensors_roundtrip(tmp_path: Any) -> None:
    from safetensors.torch import load_file

    p, t = _mlp_pair("cpu")
    path = tmp_path / "mlp.safetensors"
    nn.save(p, path)
    t.load_state_dict(load_file(str(path)))  # readable by torch
    q = nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    q.load_state_dict(nn.load(path))
    for k, v in q.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), p.state_dict()[k].numpy())
    with pytest.raises(plait.PlaitError):
        nn.load(tmp_path / "missing.safetensors")


def test_module_api() -> None:
    m = nn.Sequential(nn.Conv2d(2, 4, 3), nn.Dropout(0.5), nn.Flatten())
    assert [n for n, _ in m.named_parameters()] == ["0.weight", "0.bias"]
    m.eval()
    assert not m[1].training
    m.train()
    assert m[1].training
    with pytest.raises(plait.ShapeError, match="Conv2d"):
        m(plait.Tensor.zeros(1, 3, 5, 5, device="cpu"))
    x = plait.tensor(np.ones((1, 3), np.float32), requires_grad=True)
    with pytest.raises(plait.PlaitError, match="non-scalar"):
        (x * 2).backward()
