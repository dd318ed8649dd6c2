"""The backend's registration, options, per-op lowerings (forward and backward) and plait.explain."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import plait
from tests.torch.helpers import assert_close, compile_plait, run_no_fallback


def test_entry_point_registers_backend_without_import() -> None:
    code = (
        "import sys, torch\n"
        "from torch._dynamo.backends.registry import list_backends\n"
        "assert 'plait' in list_backends(exclude_tags=()), list_backends(exclude_tags=())\n"
        "f = torch.compile(lambda x: torch.relu(x) * 2, backend='plait', options={'device': 'cpu'})\n"
        "x = torch.randn(5)\n"
        "assert torch.allclose(f(x), torch.relu(x) * 2)\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ok" in out.stdout


def test_unknown_option_is_a_plait_error() -> None:
    from plait.frontends.torch.backend import parse_options

    with pytest.raises(plait.PlaitError, match="unknown options"):
        parse_options({"devcie": "cpu"})
    with pytest.raises(plait.DeviceError):
        parse_options({"device": "tpu"})
    assert parse_options({"device": "cpu"}) == "cpu"


def test_default_device_follows_plait_device() -> None:
    from plait import settings
    from plait.frontends.torch.backend import parse_options

    with settings.override(PLAIT_DEVICE="cpu"):
        assert parse_options(None) == "cpu"


OPS = {
    "arith": (lambda x, y: (x * 2 - y) / (y.abs() + 1) + x.pow(2), [(3, 4), (4,)]),
    "unary": (lambda x, y: x.exp().log1p() + x.sigmoid() * x.tanh() - torch.rsqrt(y.abs() + 1), [(6,), (6,)]),
    "act": (lambda x, y: F.gelu(x) + F.silu(y) + F.relu6(x * 4) + F.hardswish(y) + F.leaky_relu(x), [(8,), (8,)]),
    "reduce": (lambda x, y: x.sum(1) + x.mean(1) + x.amax(1) - y.var(0), [(4, 5), (3, 4)]),
    "softmax": (lambda x, y: F.softmax(x, -1) * F.log_softmax(y, 0), [(3, 5), (3, 5)]),
    "movement": (
        lambda x, y: torch.cat([x.t(), y[1:, ::2].t()], 0).flip(1).unsqueeze(0).expand(2, -1, -1),
        [(3, 2), (4, 4)],
    ),
    "split": (lambda x, y: sum(p.sum(0) for p in x.split(2, 0)) * y.select(0, 1), [(6, 3), (2, 3)]),
    "matmul": (
        lambda x, y: (x @ y).relu() @ y.t() + torch.bmm(x.unsqueeze(0), y.unsqueeze(0))[0].sum(),
        [(5, 4), (4, 4)],
    ),
    "where": (lambda x, y: torch.where(x > y, x, y * 3) + (x < 0).float(), [(4, 4), (4, 4)]),
    "norm": (lambda x, y: F.layer_norm(x, (5,), y[0], y[1]) + F.pad(x, (1, 0))[:, :5], [(3, 5), (2, 5)]),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_op_forward_and_backward(name: str, device: str) -> None:
    fn, shapes = OPS[name]
    xs = [torch.randn(*s, requires_grad=True) for s in shapes]
    ref = [x.detach().clone().requires_grad_(True) for x in xs]
    out = run_no_fallback(compile_plait(fn, device), *xs)
    want = fn(*ref)
    assert_close(out, want, what=f"{name} forward on {device}")
    w = torch.randn_like(want)
    (out * w).sum().backward()
    (want * w).sum().backward()
    for i, (a, b) in enumerate(zip(xs, ref)):
        assert_close(a.grad, b.grad, what=f"{name} gradient of input {i} on {device}")


def test_conv_pool_norm_backward(device: str) -> None:
    torch.manual_seed(1)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 6, 3, stride=2, padding=1),
        torch.nn.BatchNorm2d(6),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, padding=1),
        torch.nn.Conv2d(6, 4, 1, groups=2),
        torch.nn.AvgPool2d(2),
        torch.nn.AdaptiveAvgPool2d(3),
        torch.nn.Flatten(),
        torch.nn.Linear(36, 3),
    )
    ref = __import__("copy").deepcopy(net)
    x = torch.randn(2, 3, 13, 13)
    out = run_no_fallback(compile_plait(net, device), x)
    want = ref(x)
    assert_close(out, want, what="forward")
    out.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, what=f"gradient of {name}")
    assert_close(net[1].running_var, ref[1].running_var, what="running_var")


def test_explain_reports_split_and_kernels() -> None:
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    before = [p.detach().clone() for p in net.parameters()]
    report = plait.explain(net, torch.randn(3, 4), device="cpu")
    assert report.kernels >= 1 and report.partitions == 1
    assert "aten.addmm.default" in report.plait_ops and not report.torch_ops
    assert "kernel" in str(report)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
