"""Split-K for linear layers on OpenCL: a batch-64 product against a transposed weight (x @ W^T, alexnet's and
vgg16's fc layers) with few output tiles is chunked along K in the weight's stored layout (the chunks are views),
the partial products summed by a reduction that carries the bias and ReLU; results against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
import plait.tune
from plait.codegen.gemm import GemmSpec
from plait.codegen.gemm_tc import mma_tf32_unsupported
from plait.runtime import get_device
from plait.schedule.scheduler import schedule
from tests.conftest import DEVICES
from tests.helpers import assert_close

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]
SMALL = {"V": 3, "BM": 32, "BN": 32, "BK": 8, "WM": 16, "WN": 16}


def _gemms(out: plait.Tensor) -> list[GemmSpec]:
    items = schedule([out.node], 256, implicit_conv=True, split_k=True)
    return [it.gemm for it in items if it.gemm is not None]


def test_transposed_weight_chunks_are_views():
    """alexnet's fc layers at batch 64 split K into chunks of the stored weight (strides along K stay 1), enough of
    them to stream the weight (scheduler.STREAM_SPLIT_TARGET, chunks of K <= 2048); a weight stored (K, N) keeps
    the few-tile rule, and wide products stay whole."""
    rng = np.random.default_rng(0)

    def t(*shape: int) -> plait.Tensor:
        return plait.tensor(rng.standard_normal(shape, dtype=np.float32))

    (fc1,) = _gemms(t(64, 9216) @ t(4096, 9216).T)
    assert (fc1.batch, fc1.m, fc1.n, fc1.k) == (6, 64, 4096, 1536)
    assert (fc1.b_inner, fc1.b[2], fc1.b[3]) == (1536, 1, 9216)  # chunk stride, K stride, N stride in the weight
    (fc2,) = _gemms(t(64, 4096) @ t(4096, 4096).T)
    assert (fc2.batch, fc2.k) == (8, 512)
    (fc3,) = _gemms(t(64, 4096) @ t(1000, 4096).T)
    assert (fc3.batch, fc3.k) == (16, 256)
    (plain,) = _gemms(t(64, 4096) @ t(4096, 1000))
    assert (plain.batch, plain.k) == (8, 512)
    (wide,) = _gemms(t(512, 4096) @ t(4096, 4096).T)
    assert (wide.batch, wide.k) == (1, 4096)


def test_batch_one_linear_layers_stay_whole():
    """At batch 1 a linear layer's product (x @ W^T, one row) stays one GEMV over the whole K: neither split nor
    swapped into W @ x^T, a one-column GEMM split along K (alexnet b1 on an H100 ran 0.37 instead of 0.26 ms)."""
    rng = np.random.default_rng(0)

    def t(*shape: int) -> plait.Tensor:
        return plait.tensor(rng.standard_normal(shape, dtype=np.float32))

    for k, n in [(9216, 4096), (4096, 4096), (25088, 4096), (4096, 1000)]:
        (fc,) = _gemms(t(1, k) @ t(n, k).T)
        assert (fc.batch, fc.m, fc.n, fc.k) == (1, 1, n, k)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_split_linear_layer_matches_torch(device, monkeypatch):
    """A linear layer with bias and ReLU at batch 64 (K 2048 split in chunks of 256) runs as a batch of chunk
    products and a reduction, and matches PyTorch."""
    mma = 0 if mma_tf32_unsupported(get_device(device)) else 1

    def knobs(device: object, kind: str, spec: GemmSpec) -> dict[str, int]:
        return {"V": 4} if spec.m <= 15 else {**SMALL, "MMA": mma}

    monkeypatch.setattr(plait.tune, "_heuristic", knobs)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 2048), dtype=np.float32)
    w = rng.standard_normal((96, 2048), dtype=np.float32) * 0.05
    bias = rng.standard_normal(96, dtype=np.float32)

    def net(t: plait.Tensor) -> plait.Tensor:
        return F.linear(t, plait.tensor(w, device=device), plait.tensor(bias, device=device)).relu()

    fn = plait.jit(net, device=device)
    got = fn(x)
    want = torch.relu(torch.nn.functional.linear(*(torch.from_numpy(v) for v in (x, w, bias))))
    assert_close(got, want.numpy(), "float32", f"split-K linear on {device}", tol_scale=10)
    plan, _ = fn.plan_for([x])
    names = [k.name for k in plan.kernels]
    kind = "GEMM3XTF32_" if mma else "GEMM3XTF32EMU_"
    assert any(name.startswith(f"{kind}8x64x96x256_") for name in names), names
