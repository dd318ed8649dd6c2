"""An image stem keeps the cpu's direct convolution kernel whatever the tuning cache holds: a cached register tile
(MR/NR) is ignored for it, and `tune_plan` counts it as a product with nothing to tune instead of timing GEMM tiles
against it and caching one of them."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
import plait.tune
from plait import settings
from plait.codegen import gemm
from plait.runtime import get_device
from plait.tune.model import tune_plan
from tests.helpers import assert_close, rand


@pytest.fixture
def fresh_tuning(tmp_path, monkeypatch):
    """An empty tuning cache, so no other test's winners leak in and none of these leak out."""
    monkeypatch.setattr(plait.tune, "_memo", {})
    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        yield


def _stem():
    x = rand((1, 3, 30, 26), low=-1, high=1)
    wt, b = rand((16, 3, 7, 7), seed=1, low=-1, high=1) * 0.2, rand((16,), seed=2)
    wp, bp = plait.tensor(wt, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wp, bp, stride=2, padding=3).relu(), device="cpu")
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), 2, 3).relu()
    return f, x, want.numpy()


def test_cached_tile_keeps_the_direct_stem(fresh_tuning):
    f, x, want = _stem()
    plan, _ = f.plan_for([x])
    (item,) = [i for i in plan.items if i.kind == "gemm"]
    assert item.gemm is not None and gemm.direct_conv(item.gemm)
    plait.tune.remember(get_device("cpu"), "gemm", item.gemm, {"MR": 8, "NR": 48})
    f2, _, _ = _stem()
    got = np.asarray(f2(x))
    plan2, _ = f2.plan_for([x])
    assert ["plait_conv_direct(" in k.source for k in plan2.kernels] == [True], [k.name for k in plan2.kernels]
    assert_close(got, want, "float32", "stem under a cached tile", tol_scale=10)


def test_tune_plan_leaves_the_stem_alone(fresh_tuning):
    f, x, want = _stem()
    assert_close(np.asarray(f(x)), want, "float32", "stem", tol_scale=10)
    plan, _ = f.plan_for([x])
    report = tune_plan(plan, budget_s=60, reps=2, log=lambda s: None)
    assert (report.fixed, len(report.tuned), report.cached) == (1, 0, 0)
    (item,) = [i for i in plan.items if i.kind == "gemm"]
    assert plait.tune.signature("gemm", item.gemm) not in plait.tune._db(get_device("cpu"))
