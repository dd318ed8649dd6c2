"""Tuning a whole plan (`plait.tune.model.tune_plan`, `plait tune --model`): winners are cached per device, reused
by the next plan of the same products, and the retuned plan still computes what NumPy does."""

from __future__ import annotations

import numpy as np
import pytest

import plait
import plait.tune
import plait.tune.model
from plait import settings
from plait.errors import PlaitError
from plait.tune.model import tune_plan


@pytest.fixture
def fresh_tuning(tmp_path, monkeypatch):
    """An empty cache folder and tuning table, so no other test's winners leak in and none of these leak out."""
    monkeypatch.setattr(plait.tune, "_memo", {})
    # the first four configurations of each search: every step of tuning runs, with a fraction of the cold builds
    full = plait.tune.model.candidates
    monkeypatch.setattr(plait.tune.model, "candidates", lambda device, spec=None: full(device, spec)[:4])
    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        yield


def _conv_then_linear(device: str):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 4, 3, 3)).astype(np.float32) * 0.2
    fc = rng.standard_normal((16 * 6 * 6, 32)).astype(np.float32) * 0.05
    wt = plait.Tensor.from_numpy(w, device=device)
    fct = plait.Tensor.from_numpy(fc, device=device)

    def fn(x):
        y = plait.nn.functional.conv2d(x, wt, padding=0).relu()
        return y.reshape(x.shape[0], -1) @ fct

    x = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    return fn, x, w, fc


def _reference(x, w, fc):
    import torch

    y = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).relu()
    return (y.reshape(x.shape[0], -1) @ torch.from_numpy(fc)).numpy()


def test_tune_plan_caches_winners_and_keeps_results(device, fresh_tuning):
    fn, x, w, fc = _conv_then_linear(device)
    f = plait.jit(fn, device=device)
    want = _reference(x, w, fc)
    np.testing.assert_allclose(f(x), want, rtol=1e-4, atol=1e-4)
    plan, _ = f.plan_for([x])
    report = tune_plan(plan, budget_s=120, reps=2, log=lambda s: None)
    searched = len(report.tuned)
    assert searched + report.fixed == 2 and report.left == 0 and report.cached == 0
    assert all(t.tried >= 2 and t.after_s <= t.before_s for t in report.tuned)
    assert "products searched" in report.summary()
    # the plan's buffers still hold its own result, and a new plan built with the tuned knobs agrees with NumPy
    np.testing.assert_allclose(f(x), want, rtol=1e-4, atol=1e-4)
    g = plait.jit(fn, device=device)
    np.testing.assert_allclose(g(x), want, rtol=1e-4, atol=1e-4)
    again = tune_plan(g.plan_for([x])[0], budget_s=120, reps=2, log=lambda s: None)
    assert again.cached == searched and not again.tuned


def test_tune_plan_rejects_a_bad_budget(fresh_tuning):
    fn, x, _, _ = _conv_then_linear("cpu")
    f = plait.jit(fn, device="cpu")
    f(x)
    with pytest.raises(PlaitError, match="budget"):
        tune_plan(f.plan_for([x])[0], budget_s=0)
