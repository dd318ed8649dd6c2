"""The C GEMM's k split (plait/codegen/gemm_c.py KSPLIT): a batch-1 product whose rows would be split between the
threads over one shared packing of a B much larger than C (a 3x3 convolution over many channels on a 7x7 plane, a
long-k product with few columns) instead gives each thread a share of k and sums the partial products. With 1, 2
and 3 threads (3: shares of k and of C's rows that do not divide evenly), as one team run and kernel by kernel,
with an epilogue (bias, ReLU), a carried residual, a partial last row block and a fringe column, the result matches
PyTorch in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import winograd_c
from plait.schedule.plan import read, run_launches


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64)


def _team_and_alone(f: object, *args: np.ndarray) -> list[np.ndarray]:
    """The plan's outputs as one team run, after checking that launching its kernels one by one gives the same."""
    plan, _ = f.plan_for(list(args))  # type: ignore[attr-defined]
    team = [np.asarray(o) for o in plan(*args)]
    run_launches(plan.device, plan.launches)
    alone = [read(plan.device, plan.buffers[o.uid], o) for o in plan.outputs]
    for a, b in zip(team, alone, strict=True):
        np.testing.assert_array_equal(a, b)
    return team


def test_ksplit_convolution_matches_torch(team_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Implicit-GEMM convolutions (Winograd's pick declined): 37 output channels (8-row tiles: a partial last block) of a 3x3 convolution over 160 channels on 7x7 (k =
    1440, 49 columns: one panel and a one-column fringe), with bias and ReLU, then a second one whose result is
    added to the first (the residual carried in C)."""
    monkeypatch.setattr(winograd_c, "pick", lambda *args, **kwargs: None)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 160, 7, 7)).astype(np.float32)
    w1 = (rng.standard_normal((37, 160, 3, 3)) / 30).astype(np.float32)
    b1 = rng.standard_normal(37).astype(np.float32)
    w2 = (rng.standard_normal((37, 37, 3, 3)) / 15).astype(np.float32)
    p = {k: plait.tensor(v, device="cpu") for k, v in {"w1": w1, "b1": b1, "w2": w2}.items()}

    def net(t: plait.Tensor) -> plait.Tensor:
        y = F.conv2d(t, p["w1"], p["b1"], 1, 1).relu()
        return F.conv2d(y, p["w2"], None, 1, 1) + y

    f = plait.jit(net, device="cpu")
    assert [k.name.split("_")[0] for k in f.plan_for([x])[0].kernels] == ["CONV", "CONV"]
    got = _team_and_alone(f, x)[0]
    y = torch.relu(torch.nn.functional.conv2d(_t(x), _t(w1), _t(b1), 1, 1))
    want = torch.nn.functional.conv2d(y, _t(w2), None, 1, 1) + y
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


def test_ksplit_matrix_product_matches_torch(team_size: int) -> None:
    """A strided B operand: 45 x 2000 times 2000 x 20 (few columns, long k), then ReLU."""
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((45, 2000)) / 40).astype(np.float32)
    b = rng.standard_normal((2000, 20)).astype(np.float32)
    got = _team_and_alone(plait.jit(lambda s, t: (s @ t).relu(), device="cpu"), a, b)[0]
    want = torch.relu(_t(a) @ _t(b))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
