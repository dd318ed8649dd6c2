"""Ops and dtypes plait does not support run in PyTorch with one warning; failures never touch the model."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import plait
from plait.frontends.torch.partition import PlaitFallbackWarning
from tests.torch.helpers import assert_close, compile_plait


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        h = torch.cumsum(h, dim=1)  # no plait lowering: runs in PyTorch
        return self.b(h)


def test_unsupported_op_falls_back_with_one_warning(device: str) -> None:
    net = Mixed()
    x = torch.randn(3, 4, requires_grad=True)
    with pytest.warns(PlaitFallbackWarning, match="aten.cumsum") as record:
        out = compile_plait(net, device)(x)
        out.sum().backward()
    assert len([w for w in record if issubclass(w.category, PlaitFallbackWarning)]) == 1
    ref = copy.deepcopy(net)
    xr = x.detach().clone().requires_grad_(True)
    want = ref(xr)
    want.sum().backward()
    assert_close(out, want)
    assert_close(x.grad, xr.grad)
    assert_close(net.a.weight.grad, ref.a.weight.grad)


def test_explain_names_where_ops_ran() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlaitFallbackWarning)
        report = plait.explain(Mixed(), torch.randn(3, 4), device="cpu")
    assert "aten.cumsum.default" in report.torch_ops
    assert "aten.addmm.default" in report.plait_ops
    assert report.partitions == 2 and report.kernels >= 2
    assert "pytorch  aten.cumsum.default" in str(report)


def test_float64_model_falls_back_and_matches(device: str) -> None:
    net = torch.nn.Linear(3, 2).double()
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.warns(PlaitFallbackWarning, match="float64"):
        out = compile_plait(net, device)(x)
    assert out.dtype == torch.float64
    assert_close(out, net(x))


def test_failure_inside_plait_leaves_parameters_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    from plait.schedule.plan import Plan

    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    state = copy.deepcopy(net.state_dict())
    compiled = compile_plait(net, "cpu")

    def broken(self: Plan) -> None:
        raise RuntimeError("simulated device fault")

    monkeypatch.setattr(Plan, "run", broken)
    with pytest.raises(plait.PlaitError, match="simulated device fault"):
        compiled(torch.randn(5, 4)).sum().backward()
    for k, v in net.state_dict().items():
        assert torch.equal(v, state[k]), f"{k} changed although plait failed"
    assert all(p.grad is None for p in net.parameters())
