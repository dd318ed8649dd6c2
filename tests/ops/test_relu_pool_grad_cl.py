"""Max pooling over a ReLU under autograd on OpenCL (`plait.nn.functional._relu_pool_grad`): the pool's gradient
goes straight to the ReLU's input, masked by the pooled output being positive, instead of through ReLU's own
backward pass over the whole input. Checked exactly against PyTorch (the mask multiplies by 0 or 1), with windows
that are all negative or zero, ties, padding, and a second reader of the ReLU's output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.schedule.plan import Plan
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]

CASES = [  # shape, kernel, stride, padding
    ((2, 3, 11, 11), 3, 2, 0),  # alexnet's overlapping pools
    ((2, 2, 9, 9), 3, 2, 1),  # resnet's stem pool, padded
    ((1, 2, 8, 7), 2, 1, 0),
]


def _input(shape: tuple[int, ...]) -> np.ndarray:
    """Values with ties at zero and whole windows at or below zero, where ReLU's mask decides."""
    z = rand(shape)
    z[..., 1::3, :] = 0.0
    z[..., :3, :3] = -np.abs(z[..., :3, :3])
    return z


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("case", CASES)
def test_relu_pool_gradient_matches_torch(device: str, case: tuple) -> None:
    shape, k, s, p = case
    z = _input(shape)
    up = rand(tuple(torch.nn.functional.max_pool2d(torch.tensor(z), k, s, p).shape), seed=1)
    zp = plait.tensor(z, device=device, requires_grad=True)
    out = F.max_pool2d(F.relu(zp), k, s, p)
    (out * plait.tensor(up, device=device)).sum().backward()
    zt = torch.tensor(z, requires_grad=True)
    ref = torch.nn.functional.max_pool2d(torch.relu(zt), k, s, p)
    (ref * torch.tensor(up)).sum().backward()
    assert zp.grad is not None and zt.grad is not None
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    np.testing.assert_array_equal(zp.grad.numpy(), zt.grad.numpy())


@pytest.mark.parametrize("device", CL_DEVICES)
def test_second_reader_of_the_relu(device: str) -> None:
    """The ReLU's output also feeds a sum: that reader's gradient still goes through ReLU's backward, and the
    two contributions add up to PyTorch's."""
    z = _input((2, 2, 7, 7))
    up = rand((2, 2, 3, 3), seed=1)
    zp = plait.tensor(z, device=device, requires_grad=True)
    r = F.relu(zp)
    (((F.max_pool2d(r, 3, 2) * plait.tensor(up, device=device)).sum()) + (r * r).sum()).backward()
    zt = torch.tensor(z, requires_grad=True)
    rt = torch.relu(zt)
    ((torch.nn.functional.max_pool2d(rt, 3, 2) * torch.tensor(up)).sum() + (rt * rt).sum()).backward()
    assert zp.grad is not None and zt.grad is not None
    np.testing.assert_allclose(zp.grad.numpy(), zt.grad.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_no_relu_backward_over_the_input(device: str) -> None:
    """The gradient reaching the ReLU's input is the pool's gather itself: no where-pass of the input's size."""
    zp = plait.tensor(_input((2, 3, 11, 11)), device=device, requires_grad=True)
    out = F.max_pool2d(F.relu(zp * 2.0), 3, 2)
    seed = plait.Tensor.from_numpy(np.ones(out.shape, np.float32), device=device).node
    grads = autodiff.gradients(out.node, seed, [zp.node])
    g = grads[zp.node.uid]
    seen, stack, ops = set(), [g], []
    while stack:
        n = stack.pop()
        if n.uid in seen:
            continue
        seen.add(n.uid)
        ops.append((n.op, n.shape))
        stack.extend(n.srcs)
    assert ("max_pool2d_grad_cl", (2, 3, 11, 11)) in ops
    assert ("where", (2, 3, 11, 11)) not in ops
    assert ("where", (2, 3, 5, 5)) in ops


@pytest.mark.parametrize("device", CL_DEVICES)
def test_offsets_kernel_writes_the_pooled_output(device: str) -> None:
    """In a plan holding both, the offsets' kernel writes the pooled output too: no POOLTAKE launch."""
    zp = plait.tensor(_input((2, 3, 11, 11)), device=device, requires_grad=True)
    loss = (F.max_pool2d(F.relu(zp), 3, 2) * 2.0).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    grads = autodiff.gradients(loss.node, seed, [zp.node])
    plan = Plan([loss.node, *grads.values()])
    names = [k.name for k in plan.kernels]
    assert not any(n.startswith("POOLTAKE") for n in names), names
    assert [k.writes for k in plan.kernels if k.name.startswith("POOLARG")] == [2]


@pytest.mark.parametrize("device", CL_DEVICES)
def test_compiled_steps_match_torch(device: str) -> None:
    """Four SGD steps of conv -> ReLU -> overlapping max pool -> linear through plait.compile_step (eager, two
    traced calls, a replay of the recorded launches), against PyTorch: the loss each step and the weights after."""
    torch.manual_seed(0)
    t = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 5),
    )
    p = plait.nn.Sequential(
        plait.nn.Conv2d(3, 4, 3, padding=1),
        plait.nn.ReLU(),
        plait.nn.MaxPool2d(3, 2),
        plait.nn.Flatten(),
        plait.nn.Linear(64, 5),
    ).to(device)
    p.load_state_dict(t.state_dict())
    opt, topt = plait.optim.SGD(p.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    loss_fn = plait.nn.CrossEntropyLoss()

    @plait.compile_step(device=device)
    def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        opt.zero_grad()
        loss = loss_fn(p(x), y)
        loss.backward()
        opt.step()
        return loss

    x, y = _input((2, 3, 9, 9)), np.array([1, 3])
    for _ in range(4):
        got = float(step(x, y).item())
        topt.zero_grad()
        want = torch.nn.functional.cross_entropy(t(torch.from_numpy(x)), torch.from_numpy(y))
        want.backward()
        topt.step()
        assert abs(got - want.item()) < 1e-5, (got, want.item())
    for (name, w), tw in zip(p.state_dict().items(), t.state_dict().values(), strict=True):
        assert_close(np.asarray(w.numpy()), tw.numpy(), "float32", f"{name} after four steps")


@pytest.mark.parametrize("device", CL_DEVICES)
def test_conv_relu_computed_inside_the_pool(device: str) -> None:
    """A convolution's bias and ReLU read only by the pool are not made: the offsets' kernel computes them at each
    tap from the product (scheduler `_pool_inputs_inline`). Pooled output, input and weight gradients against
    PyTorch."""
    x, w, b = rand((2, 3, 9, 9), seed=3), rand((4, 3, 3, 3), seed=4), rand((4,), seed=5)
    up = rand((2, 4, 4, 4), seed=6)
    xp, wp, bp = (plait.tensor(a, device=device, requires_grad=True) for a in (x, w, b))
    out = F.max_pool2d(F.relu(F.conv2d(xp, wp, bp, padding=1)), 3, 2)
    loss = (out * plait.tensor(up, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    grads = autodiff.gradients(loss.node, seed, [xp.node, wp.node, bp.node])
    items = Plan([loss.node, *grads.values()]).items
    assert not [it for it in items if it.out.op == "relu"]
    pool = [it for it in items if it.out.op == "max_pool2d_argmax_cl"]
    assert len(pool) == 1 and not [n for n in pool[0].inputs if n.op == "relu"]
    loss.backward()
    xt, wt, bt = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ref = torch.nn.functional.max_pool2d(torch.relu(torch.nn.functional.conv2d(xt, wt, bt, padding=1)), 3, 2)
    (ref * torch.tensor(up)).sum().backward()
    assert_close(out.numpy(), ref.detach().numpy(), "float32", "pooled output")
    for got, want, what in ((xp, xt, "input"), (wp, wt, "weight"), (bp, bt, "bias")):
        assert got.grad is not None and want.grad is not None
        assert_close(got.grad.numpy(), want.grad.numpy(), "float32", f"{what} gradient")
