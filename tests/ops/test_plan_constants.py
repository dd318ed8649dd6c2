"""Plans with inputs run work on model parameters alone once, when they are built: batch norm's per-channel
1 / sqrt(var + eps) at inference is no launch of the replay, on every device, and results match PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from tests.conftest import DEVICES
from tests.helpers import assert_close


@pytest.mark.parametrize("device", DEVICES)
def test_batch_norm_parameters_are_folded_once(device):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 10, 10), dtype=np.float32)
    wt = rng.standard_normal((8, 3, 3, 3), dtype=np.float32)
    mean, var = rng.standard_normal(8, dtype=np.float32), rng.uniform(0.5, 2.0, 8).astype(np.float32)
    gamma, beta = rng.standard_normal(8, dtype=np.float32), rng.standard_normal(8, dtype=np.float32)

    def net(t: plait.Tensor) -> plait.Tensor:
        p = [plait.tensor(v, device=device) for v in (wt, mean, var, gamma, beta)]
        y = F.batch_norm(F.conv2d(t, p[0], None, 1, 1), p[1], p[2], p[3], p[4], training=False)
        return F.relu6(y) * (t.mean() + 1.0)  # the last factor reads the input: it stays in the replay

    fn = plait.jit(net, device=device)
    tw, tm, tv, tg, tb = (torch.from_numpy(v) for v in (wt, mean, var, gamma, beta))
    for xi in (x, x[::-1].copy() * 2.0):  # a second input: the replay recomputes what reads it, the folded values stay
        tx = torch.from_numpy(xi)
        y = torch.nn.functional.batch_norm(torch.nn.functional.conv2d(tx, tw, None, 1, 1), tm, tv, tg, tb)
        want = (y.clamp(0.0, 6.0) * (tx.mean() + 1.0)).numpy()
        assert_close(fn(xi), want, "float32", f"conv + BN + ReLU6 on {device}", tol_scale=10)
    plan, _ = fn.plan_for([x])
    once = [it for it in plan.items if it.extra.get("constant")]
    assert once and all(n.buffer is not None for n in once[0].inputs), [it.out.op for it in plan.items]
    replayed = {id(it) for it in plan.launched}
    assert not any(id(it) in replayed for it in once)
    assert len(plan.kernels) == len(plan.launched) == len([i for i in plan.items if i.kind != "alias"]) - len(once)
