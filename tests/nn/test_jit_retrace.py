"""plait.jit plans read the parameters they were traced with: after an optimizer step, load_state_dict or a
train/eval switch the function is traced again, so a jit'ed model never answers with stale weights."""

from __future__ import annotations

import numpy as np

import plait


def _linear_reference(model: plait.nn.Linear, x: np.ndarray) -> np.ndarray:
    return x @ model.weight.numpy().T + model.bias.numpy()


def test_jit_sees_optimizer_updates(device):
    rng = np.random.default_rng(0)
    model = plait.nn.Linear(6, 3).to(device)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    f = plait.jit(model, device=device)
    np.testing.assert_allclose(f(x), _linear_reference(model, x), rtol=1e-5, atol=1e-5)
    opt = plait.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    xt = plait.Tensor.from_numpy(x, device=device)
    for _ in range(2):
        opt.zero_grad()
        (model(xt) ** 2).mean().backward()
        opt.step()
    np.testing.assert_allclose(f(x), _linear_reference(model, x), rtol=1e-5, atol=1e-5)


def test_jit_sees_compiled_step_updates_and_loaded_weights(device):
    rng = np.random.default_rng(1)
    model = plait.nn.Linear(5, 2).to(device)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    f = plait.jit(model, device=device)
    f(x)
    opt = plait.optim.SGD(model.parameters(), lr=0.1)

    @plait.compile_step(device=device)
    def step(t):
        opt.zero_grad()
        loss = (model(t) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(5):  # eager, two traced calls, then replays
        step(x)
    np.testing.assert_allclose(f(x), _linear_reference(model, x), rtol=1e-5, atol=1e-5)
    state = {k: np.full(v.shape, 0.25, np.float32) for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    np.testing.assert_allclose(f(x), x @ np.full((5, 2), 0.25, np.float32) + 0.25, rtol=1e-5, atol=1e-5)


def test_jit_follows_train_eval_switch(device):
    rng = np.random.default_rng(2)
    bn = plait.nn.BatchNorm1d(4).to(device)
    x = (rng.standard_normal((8, 4)) * 3 + 1).astype(np.float32)
    bn.eval()
    f = plait.jit(bn, device=device)
    np.testing.assert_allclose(f(x), x / np.sqrt(1 + bn.eps), rtol=1e-5, atol=1e-5)  # running mean 0, var 1
    bn.train()
    want = (x - x.mean(0)) / np.sqrt(x.var(0) + bn.eps)  # batch statistics
    np.testing.assert_allclose(f(x), want, rtol=1e-4, atol=1e-4)
