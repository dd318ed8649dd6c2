"""Forward and backward of every float op against PyTorch (tests.helpers.check_op) on every device."""

import pytest
import torch

import plait
from tests.helpers import check_op

POSITIVE = {"low": 0.5, "high": 2.0}
CASES = {
    "add": (lambda x, y: x + y, [(3, 4), (4,)], None, {}),
    "sub": (lambda x, y: x - y, [(3, 1), (1, 4)], None, {}),
    "mul": (lambda x, y: x * y, [(2, 3, 4), (3, 1)], None, {}),
    "div": (lambda x, y: x / y, [(3, 4), (3, 4)], None, POSITIVE),
    "pow": (lambda x, y: x**y, [(3, 4), (4,)], None, POSITIVE),
    "scalars": (lambda x: 1.5 - x * 2 + 3 / (x + 4), [(5,)], None, POSITIVE),
    "neg": (lambda x: -x, [(5,)], None, {}),
    "exp": (lambda x: x.exp(), [(5,)], None, {}),
    "log": (lambda x: x.log(), [(5,)], None, POSITIVE),
    "sqrt": (lambda x: x.sqrt(), [(5,)], None, POSITIVE),
    "abs": (lambda x: x.abs(), [(5,)], None, {}),
    "relu": (lambda x: x.relu(), [(5,)], None, {}),
    "sigmoid": (lambda x: x.sigmoid(), [(5,)], None, {}),
    "tanh": (lambda x: x.tanh(), [(5,)], None, {}),
    "maximum": (lambda x, y: x.maximum(y), [(3, 4), (4,)], torch.maximum, {}),
    "minimum": (lambda x, y: x.minimum(y), [(3, 4), (3, 1)], torch.minimum, {}),
    "where": (lambda x, y: plait.where(x > 0, x, y), [(3, 4), (4,)], lambda x, y: torch.where(x > 0, x, y), {}),
    "sum": (lambda x: x.sum(axis=(0, 2)), [(2, 3, 4)], lambda x: x.sum(dim=(0, 2)), {}),
    "mean": (lambda x: x.mean(axis=1, keepdims=True), [(2, 3, 4)], lambda x: x.mean(dim=1, keepdim=True), {}),
    "max": (lambda x: x.max(axis=1), [(2, 3, 4)], lambda x: x.amax(dim=1), {}),
    "min": (lambda x: x.min(), [(2, 3, 4)], lambda x: x.amin(), {}),
    "reshape": (lambda x: x.reshape(4, 6), [(2, 3, 4)], None, {}),
    "permute": (lambda x: x.permute(2, 0, 1), [(2, 3, 4)], None, {}),
    "transpose": (lambda x: x.transpose(0, 2), [(2, 3, 4)], None, {}),
    "expand": (lambda x: x.expand(2, 3, 4), [(3, 1)], None, {}),
    "pad": (lambda x: x.pad(((1, 2), (0, 1))), [(3, 4)], lambda x: torch.nn.functional.pad(x, (0, 1, 1, 2)), {}),
    "slice": (lambda x: x[1:, ::2], [(4, 5)], None, {}),
    "negative step": (lambda x: x[::-2, 3:0:-1], [(5, 4)], lambda x: x.flip(0)[::2].flip(1)[:, :3], {}),
    "cat": (lambda x, y: plait.cat([x, y], axis=1), [(2, 3), (2, 2)], lambda x, y: torch.cat([x, y], dim=1), {}),
    "flip": (lambda x: x.flip(1), [(2, 3, 4)], lambda x: x.flip(1), {}),
    "matmul": (lambda x, y: x @ y, [(2, 3, 5), (5, 4)], None, {}),
    "matmul 1d": (lambda x, y: x @ y, [(5,), (5, 4)], None, {}),
    "matmul transposed": (lambda x, y: x @ y.transpose(-1, -2), [(2, 3, 5), (2, 4, 5)], None, {}),
    "softmax": (
        lambda x: (x - x.max(axis=-1, keepdims=True)).exp() / (x - x.max(axis=-1, keepdims=True)).exp().sum(-1, True),
        [(3, 7)],
        lambda x: x.softmax(-1),
        {},
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_match_torch(device, name):
    fn, shapes, torch_fn, kw = CASES[name]
    check_op(fn, shapes, device, torch_fn=torch_fn, **kw)


def test_gradient_accumulates_over_uses_and_calls(device):
    x = plait.tensor([1.0, -2.0, 3.0], device=device, requires_grad=True)
    (x * x + x).sum().backward()
    (x * 3).sum().backward()
    tx = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    (tx * tx + tx).sum().backward()
    (tx * 3).sum().backward()
    assert x.grad is not None
    assert x.grad.numpy().tolist() == tx.grad.numpy().tolist()


def test_half_gradients(device):
    check_op(lambda x, y: (x * y).tanh(), [(4, 3), (3,)], device, dtype="float16")
