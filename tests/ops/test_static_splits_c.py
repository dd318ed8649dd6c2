"""The cpu kernels' task loops hand each thread a contiguous run of tasks (`schedule(static)`, plait/codegen/gemm_c.py
"Static task schedules"): with 1, 2 and 3 threads (3: task counts that do not divide evenly) a small net through the
implicit-GEMM convolution, 1x1 products across the lanes, a depthwise convolution, the GEMV and the pointwise few-row
product gives PyTorch's result, as one team run and kernel by kernel alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import pointwise_c
from plait.schedule import irblock
from plait.schedule.plan import read, run_launches


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64)


def test_static_task_splits_match_torch(team_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(irblock, "MAX_PIXELS", 0)  # the 1x1, depthwise and 1x1 layers stay three kernels here
    monkeypatch.setattr(pointwise_c, "LANES", True)  # the lanes kernel at the host's vector width, whatever it is
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 30, 30)).astype(np.float32)
    ws = {
        "stem": rng.standard_normal((24, 3, 3, 3)) / 5,  # stride 2: 15x15
        "conv": rng.standard_normal((24, 24, 3, 3)) / 15,  # 3x3 stride 1
        "expand": rng.standard_normal((96, 24, 1, 1)) / 5,  # 1x1 over 225 pixels, 96 channels: across the lanes
        "dw": rng.standard_normal((96, 1, 3, 3)) / 3,  # depthwise
        "proj": rng.standard_normal((16, 96, 1, 1)) / 10,  # 1x1, 16 rows
        "fc": rng.standard_normal((10, 16)) / 4,  # batch 1: the GEMV
    }
    ws = {k: v.astype(np.float32) for k, v in ws.items()}
    big = rng.standard_normal((16, 24, 40, 40)).astype(np.float32)  # pointwise few-row product over 1600 pixels
    wbig = (rng.standard_normal((16, 24, 1, 1)) / 5).astype(np.float32)
    p = {k: plait.tensor(v, device="cpu") for k, v in {**ws, "wbig": wbig}.items()}

    def net(t: plait.Tensor, u: plait.Tensor) -> tuple[plait.Tensor, plait.Tensor]:
        y = F.conv2d(t, p["stem"], None, 2, 1).relu()
        y = F.conv2d(y, p["conv"], None, 1, 1).relu()
        e = F.conv2d(y, p["expand"]).clip(0.0, 6.0)
        e = F.conv2d(e, p["dw"], None, 1, 1, 1, 96).clip(0.0, 6.0)
        z = F.conv2d(e, p["proj"])
        return F.linear(z.mean(axis=(2, 3)), p["fc"]), F.conv2d(u, p["wbig"]).relu()

    f = plait.jit(net, device="cpu")
    plan, _ = f.plan_for([x, big])
    kinds = {k.name.split("_")[0] for k in plan.kernels}
    assert {"CONV", "PWLANES", "DWCONV", "GEMV", "GEMM"} <= kinds, kinds
    team = [np.asarray(o) for o in plan(x, big)]
    run_launches(plan.device, plan.launches)
    alone = [read(plan.device, plan.buffers[o.uid], o) for o in plan.outputs]
    for a, b in zip(team, alone, strict=True):
        np.testing.assert_array_equal(a, b)
    tw = {k: _t(v) for k, v in ws.items()}
    y = torch.relu(torch.nn.functional.conv2d(_t(x), tw["stem"], None, 2, 1))
    y = torch.relu(torch.nn.functional.conv2d(y, tw["conv"], None, 1, 1))
    e = torch.clamp(torch.nn.functional.conv2d(y, tw["expand"]), 0.0, 6.0)
    e = torch.clamp(torch.nn.functional.conv2d(e, tw["dw"], None, 1, 1, 1, 96), 0.0, 6.0)
    z = torch.nn.functional.conv2d(e, tw["proj"])
    head = torch.nn.functional.linear(z.mean(dim=(2, 3)), tw["fc"])
    np.testing.assert_allclose(team[0], head.numpy(), rtol=1e-4, atol=1e-3)
    ref = torch.relu(torch.nn.functional.conv2d(_t(big), _t(wbig))).numpy()
    np.testing.assert_allclose(team[1], ref, rtol=1e-4, atol=1e-4)
