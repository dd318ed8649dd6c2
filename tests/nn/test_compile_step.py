"""plait.compile_step: a replayed training step gives the parameters, optimizer state and running statistics that
PyTorch's eager step gives, and refuses steps that a replay of recorded kernels cannot reproduce."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import plait
import plait.nn as nn
from plait.frontends.native.jit import CompiledStep

STEPS = 6  # call 1 eager, calls 2-3 traced, calls 4-6 replayed


def _mlp_pair(device: str) -> tuple[nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    # no bias before the BatchNorm: its gradient is zero up to rounding, which Adam's division would amplify
    t = torch.nn.Sequential(
        torch.nn.Linear(6, 8, bias=False), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )
    p = nn.Sequential(nn.Linear(6, 8, bias=False), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).to(device)
    p.load_state_dict(t.state_dict())
    return p, t


def _cnn_pair(device: str) -> tuple[nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    t = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1, bias=False),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(4 * 3 * 3, 3),
    )
    p = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(36, 3),
    ).to(device)
    p.load_state_dict(t.state_dict())
    return p, t


def _torch_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[np.ndarray, np.ndarray], float]:
    def step(x: np.ndarray, y: np.ndarray) -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return float(loss.item())

    return step


def _plait_step(model: nn.Module, opt: plait.optim.Optimizer, device: str = "cpu") -> CompiledStep:
    @plait.compile_step(device=device)
    def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    assert isinstance(step, CompiledStep)
    return step


def _batches(shape: tuple[int, ...], n: int = STEPS) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal(shape).astype(np.float32), rng.integers(0, 3, shape[0])) for _ in range(n)]


def _assert_same_state(p: nn.Module, t: torch.nn.Module) -> None:
    ref = t.state_dict()
    for k, v in p.state_dict().items():
        np.testing.assert_allclose(v.numpy(), ref[k].numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


def _replays(step: CompiledStep) -> int:
    return sum(1 for tr in step.traces.values() if tr.replay is not None)


OPTIMIZERS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.01}),
    ("AdamW", {"lr": 0.01}),
]


@pytest.mark.parametrize("name,kw", OPTIMIZERS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPTIMIZERS)])
def test_replayed_step_matches_torch(name: str, kw: dict[str, Any], device: str) -> None:
    p, t = _mlp_pair(device)
    po, to = getattr(plait.optim, name)(p.parameters(), **kw), getattr(torch.optim, name)(t.parameters(), **kw)
    step, ref = _plait_step(p, po, device), _torch_step(t, to)
    losses = []
    for x, y in _batches((5, 6)):
        losses.append(step(x, y))
        np.testing.assert_allclose(losses[-1].item(), ref(x, y), rtol=1e-5)
    assert _replays(step) == 1
    _assert_same_state(p, t)  # weights and BatchNorm running statistics
    for pp, tp in zip(p.parameters(), t.parameters(), strict=True):  # momentum / Adam moments
        for key, value in to.state[tp].items():
            mine = po.state[id(pp)].get(key)
            if isinstance(mine, plait.Tensor):
                np.testing.assert_allclose(mine.numpy(), value.numpy(), rtol=1e-4, atol=1e-6, err_msg=key)
    # each returned loss is its own tensor: later replays do not overwrite it
    assert len({round(float(loss.item()), 6) for loss in losses}) == len(losses)


def test_replayed_cnn_step_with_batchnorm_matches_torch(model_device: str) -> None:
    p, t = _cnn_pair(model_device)
    po = plait.optim.SGD(p.parameters(), lr=0.05, momentum=0.9)
    to = torch.optim.SGD(t.parameters(), lr=0.05, momentum=0.9)
    step, ref = _plait_step(p, po, model_device), _torch_step(t, to)
    for x, y in _batches((4, 2, 6, 6)):
        # device-resident Tensors as arguments (copied into the step's own input buffers on replay)
        got = step(plait.tensor(x, device=model_device), plait.tensor(y, device=model_device))
        np.testing.assert_allclose(got.item(), ref(x, y), rtol=1e-5)
    assert _replays(step) == 1
    _assert_same_state(p, t)


def test_learning_rate_schedule_reaches_the_replay() -> None:
    p, t = _mlp_pair("cpu")
    po, to = plait.optim.SGD(p.parameters(), lr=0.2), torch.optim.SGD(t.parameters(), lr=0.2)
    ps, ts = plait.optim.lr_scheduler.StepLR(po, 1, 0.5), torch.optim.lr_scheduler.StepLR(to, 1, 0.5)
    step, ref = _plait_step(p, po), _torch_step(t, to)
    for x, y in _batches((5, 6)):
        np.testing.assert_allclose(step(x, y).item(), ref(x, y), rtol=1e-5)
        ps.step()
        ts.step()
    _assert_same_state(p, t)


def test_state_replaced_outside_the_step_is_traced_again() -> None:
    p, t = _mlp_pair("cpu")
    po, to = plait.optim.SGD(p.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    step, ref = _plait_step(p, po), _torch_step(t, to)
    batches = _batches((5, 6), 8)
    for x, y in batches[:4]:
        step(x, y)
        ref(x, y)
    t[0].weight.data.mul_(0.5)
    p.load_state_dict(t.state_dict())  # re-points the parameters: the recorded launches would miss them
    for x, y in batches[4:]:
        np.testing.assert_allclose(step(x, y).item(), ref(x, y), rtol=1e-5)
    _assert_same_state(p, t)


def test_signatures_are_traced_separately() -> None:
    p, t = _mlp_pair("cpu")
    po, to = plait.optim.SGD(p.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    step, ref = _plait_step(p, po), _torch_step(t, to)
    # a batch size of its own each round; a round's replay is stale once the other round has moved the weights
    for shape in ((5, 6), (3, 6), (5, 6)):
        for x, y in _batches(shape, 4):
            np.testing.assert_allclose(step(x, y).item(), ref(x, y), rtol=1e-5)
    assert len(step.traces) == 2 and _replays(step) == 2
    _assert_same_state(p, t)


def _simple(body: Callable[[nn.Module, plait.Tensor, int], Any]) -> Callable[[np.ndarray], Any]:
    lin = nn.Linear(3, 2, device="cpu")
    opt = plait.optim.SGD(lin.parameters(), lr=0.1)
    calls = [0]

    @plait.compile_step
    def step(x: plait.Tensor) -> Any:
        calls[0] += 1
        opt.zero_grad()
        out = body(lin, x, calls[0])
        opt.step()
        return out

    return step  # type: ignore[no-any-return]


def _run(step: Callable[[np.ndarray], Any], n: int = 4) -> None:
    for _ in range(n):
        step(np.ones((4, 3), np.float32))


def test_reading_a_value_inside_the_step_is_refused() -> None:
    def body(lin: nn.Module, x: plait.Tensor, call: int) -> plait.Tensor:
        loss = lin(x).square().mean()
        loss.backward()
        if loss.item() > 100:  # data-dependent Python control flow
            raise AssertionError
        return loss

    with pytest.raises(plait.TraceError, match=r"reads a \(\) float32 value back to the host"):
        _run(_simple(body))


def test_a_path_that_changes_between_calls_is_refused() -> None:
    def body(lin: nn.Module, x: plait.Tensor, call: int) -> plait.Tensor:
        loss = lin(x).square().mean() if call % 2 else lin(x).abs().mean()
        loss.backward()
        return loss

    with pytest.raises(plait.TraceError, match="ran different kernels"):
        _run(_simple(body))


def test_a_host_value_that_changes_between_calls_is_refused() -> None:
    def body(lin: nn.Module, x: plait.Tensor, call: int) -> plait.Tensor:
        loss = (lin(x) * plait.tensor(np.float32(call))).mean()
        loss.backward()
        return loss

    with pytest.raises(plait.TraceError, match="changed between calls"):
        _run(_simple(body))


def test_a_python_result_is_refused() -> None:
    def body(lin: nn.Module, x: plait.Tensor, call: int) -> float:
        lin(x).sum().backward()
        return 1.0

    with pytest.raises(plait.TraceError, match="must return None, a Tensor"):
        _run(_simple(body))


def test_changing_a_compiled_hyper_parameter_is_refused() -> None:
    p, _ = _mlp_pair("cpu")
    po = plait.optim.SGD(p.parameters(), lr=0.1, momentum=0.9)
    step = _plait_step(p, po)
    batches = _batches((5, 6))
    for x, y in batches[:4]:
        step(x, y)
    po.param_groups[0]["momentum"] = 0.5
    with pytest.raises(plait.TraceError, match="other than lr changed"):
        step(*batches[4])


class _TorchGRUNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.gru = torch.nn.GRU(4, 5, batch_first=True)
        self.fc = torch.nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.gru(self.emb(x))[0][:, -1])


class _PlaitGRUNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.gru = nn.GRU(4, 5, batch_first=True)
        self.fc = nn.Linear(5, 3)

    def forward(self, x: plait.Tensor) -> plait.Tensor:
        return self.fc(self.gru(self.emb(x))[0][:, -1])


def test_replayed_recurrent_step_matches_torch() -> None:
    torch.manual_seed(0)
    t = _TorchGRUNet()
    p = _PlaitGRUNet()
    p.load_state_dict(t.state_dict())
    po, to = plait.optim.Adam(p.parameters(), lr=0.01), torch.optim.Adam(t.parameters(), lr=0.01)
    step, ref = _plait_step(p, po), _torch_step(t, to)
    rng = np.random.default_rng(2)
    for _ in range(STEPS):
        x, y = rng.integers(0, 10, (3, 5)), rng.integers(0, 3, 3)
        np.testing.assert_allclose(step(x, y).item(), ref(x, y), rtol=1e-5)
    assert _replays(step) == 1
    _assert_same_state(p, t)


def test_dropout_masks_are_drawn_afresh_on_replay() -> None:
    """The same seed gives the same masks in the same order, eager or replayed, so the weights agree exactly; a
    replay that kept the traced mask would drift."""

    def run(compiled: bool) -> list[np.ndarray]:
        nn.functional.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)).to("cpu")
        model.load_state_dict(start)
        opt = plait.optim.SGD(model.parameters(), lr=0.1)

        def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        fn = plait.compile_step(step, device="cpu") if compiled else step
        for x, y in _batches((5, 6)):
            fn(plait.tensor(x), plait.tensor(y))
        if compiled:
            assert _replays(fn) == 1
        return [p.numpy() for p in model.parameters()]

    nn.functional.manual_seed(1)
    start = {
        k: v.numpy()
        for k, v in nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)).state_dict().items()
    }
    for got, want in zip(run(True), run(False), strict=True):
        np.testing.assert_array_equal(got, want)


def test_mode_switch_and_frozen_parameters_are_traced_again() -> None:
    """eval() (BatchNorm then uses its running statistics) and requires_grad_(False) change the step's kernels
    from outside its arguments: the compiled step traces again instead of replaying the old kernels."""
    p, t = _mlp_pair("cpu")
    po = plait.optim.SGD(p.parameters(), lr=0.1, momentum=0.9)
    to = torch.optim.SGD(t.parameters(), lr=0.1, momentum=0.9)
    step, ref = _plait_step(p, po), _torch_step(t, to)
    batches = _batches((5, 6), 12)
    for i, (x, y) in enumerate(batches):
        if i == 4:
            p.eval()
            t.eval()
        if i == 8:
            p[0].weight.requires_grad_(False)
            t[0].weight.requires_grad_(False)
        np.testing.assert_allclose(step(x, y).item(), ref(x, y), rtol=1e-5)
    _assert_same_state(p, t)


def test_only_recent_signatures_keep_a_trace() -> None:
    from plait.frontends.native.jit import MAX_TRACES

    p, t = _mlp_pair("cpu")
    po, to = plait.optim.SGD(p.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    step, ref = _plait_step(p, po), _torch_step(t, to)
    for rows in range(2, MAX_TRACES + 4):  # a batch size per call, as variable sequence lengths would give
        x, y = _batches((rows, 6), 1)[0]
        np.testing.assert_allclose(step(x, y).item(), ref(x, y), rtol=1e-5)
    assert len(step.traces) == MAX_TRACES
    _assert_same_state(p, t)
