"""Reductions of a few long-ish rows on OpenCL (scheduler GROUP_SPLIT_MIN_VALUES): a cross-entropy's max, sum of
exponentials and sum over 1000 classes for a batch of images run one work-group per row, against NumPy (NaN kept)."""

from __future__ import annotations

import numpy as np
import pytest

import plait
from plait.schedule.plan import Plan
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("op", ["max", "sum", "softmax_sum"])
def test_row_reductions_run_a_work_group_per_row(device: str, op: str) -> None:
    xa = rand((64, 1000), seed=1)
    xa[3, 5] = np.nan
    x = plait.tensor(xa, device=device)
    if op == "max":
        out, want = x.max(axis=1), np.max(xa, axis=1)
    elif op == "sum":
        out, want = x.sum(axis=1), np.sum(xa, axis=1)
    else:
        out = (x - x.max(axis=1, keepdims=True)).exp().sum(axis=1)
        want = np.exp(xa - xa.max(axis=1, keepdims=True)).sum(axis=1)
    items = Plan([out.node]).items
    splits = [it.out for it in items if it.out.op == "rsplit"]
    assert splits and all(s.arg[2] == 1 and s.arg[3] > 1 for s in splits), [it.out.op for it in items]
    got = out.numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    assert_close(got[keep], want[keep].astype(np.float32), "float32", f"row {op} over 1000 values")
