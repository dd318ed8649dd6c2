"""The OpenCL depthwise-convolution kernel (kind GEMV, a few neighbouring outputs of one row per work-item, input
row spans in registers): geometries that exercise the row segment widths (4, 7, a ragged last segment), stride,
padding, dilation and non-square windows against PyTorch in float64, and a mobilenet_v2-style block through a plan
(batch norm and ReLU6 fused into the depthwise kernel's stores)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_small
from plait.codegen.gemm import GemmSpec
from plait.graph.ops.conv import Window
from plait.runtime import get_device
from tests.conftest import DEVICES
from tests.helpers import assert_close, run_gemm_kernel

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]

GEOMETRIES = [  # n, c, h, w, kh, kw, stride, padding, dilation
    (2, 3, 12, 12, 3, 3, (1, 1), (1, 1), (1, 1)),  # 4-wide segments, whole rows
    (3, 2, 7, 7, 3, 3, (1, 1), (1, 1), (1, 1)),  # one 7-wide segment per row (mobilenet_v2's last stage)
    (1, 4, 14, 14, 3, 3, (2, 2), (1, 1), (1, 1)),  # stride 2 to 7 x 7
    (2, 2, 9, 11, 3, 3, (1, 1), (1, 1), (1, 1)),  # width 11: a ragged last segment
    (1, 3, 10, 13, 5, 5, (2, 2), (2, 2), (1, 1)),  # 5 x 5, strided
    (2, 2, 11, 10, 3, 2, (2, 1), (0, 1), (2, 1)),  # non-square window, dilation, uneven padding
    (1, 2, 6, 5, 3, 3, (1, 1), (2, 3), (2, 2)),  # padding wider than the window's reach at the edges
]


def _spec(n: int, c: int, h: int, w: int, kh: int, kw: int, stride, padding, dilation) -> GemmSpec:
    """The depthwise GEMM the scheduler makes: per (image, channel), one filter times its gathered patches."""
    win = Window(n, 1, h, w, kh, kw, *stride, *padding, *dilation)
    k = kh * kw
    return GemmSpec(n * c, 1, win.oh * win.ow, k, (0, 0, k, 1), (0, c * h * w, 0, 0), c, k, h * w, win)


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_depthwise_kernel_matches_float64(device, geo):
    n, c, h, w, kh, kw, stride, padding, dilation = geo
    rng = np.random.default_rng(h * w + kh)
    x = rng.standard_normal((n, c, h, w), dtype=np.float32)
    wt = rng.standard_normal((c, 1, kh, kw), dtype=np.float32)
    spec = _spec(*geo)
    kern = gemm_small.render(spec, get_device(device).renderer)
    assert "acc0" in kern.source and "v0" in kern.source, "expected the row-segment depthwise kernel"
    got = run_gemm_kernel(device, kern, spec.batch, 1, spec.n, wt, x)
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x).double(), torch.from_numpy(wt).double(), None, stride, padding, dilation, c
    ).numpy()
    assert_close(got.reshape(want.shape), want, "float32", f"depthwise {geo} on {device}", tol_scale=10)


def test_row_segments_fit_the_plane():
    """Rows split into 4-wide segments, or a width dividing the row (7 for 7- and 14-wide planes)."""
    assert [gemm_small._row_segment(w) for w in (112, 56, 28, 14, 7, 11, 1)] == [4, 4, 4, 7, 7, 4, 4]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize(("h", "stride"), [(14, 2), (11, 1)])  # whole 7-wide rows; a ragged last segment
def test_depthwise_block_fuses_batch_norm_and_relu6(device, h, stride):
    """A mobilenet_v2-style depthwise layer at inference (conv, batch norm with running statistics, ReLU6) is one
    depthwise kernel whose stores apply the normalisation and the clamp; results match PyTorch."""
    rng = np.random.default_rng(5)
    n, c = 2, 6
    x = rng.standard_normal((n, c, h, h), dtype=np.float32)
    wt = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
    mean, var = rng.standard_normal(c, dtype=np.float32), rng.uniform(0.5, 2.0, c).astype(np.float32)
    gamma, beta = rng.standard_normal(c, dtype=np.float32), rng.standard_normal(c, dtype=np.float32)

    def net(t: plait.Tensor) -> plait.Tensor:
        p = [plait.tensor(v, device=device) for v in (wt, mean, var, gamma, beta)]
        y = F.conv2d(t, p[0], None, stride, 1, 1, c)
        y = F.batch_norm(y, p[1], p[2], p[3], p[4], training=False)
        return F.relu6(y)

    fn = plait.jit(net, device=device)
    got = fn(x)
    tx, tw, tm, tv, tg, tb = (torch.from_numpy(v) for v in (x, wt, mean, var, gamma, beta))
    y = torch.nn.functional.conv2d(tx, tw, None, stride, 1, 1, c)
    want = torch.nn.functional.batch_norm(y, tm, tv, tg, tb, training=False).clamp(0.0, 6.0)
    assert_close(got, want.numpy(), "float32", f"depthwise + BN + ReLU6 on {device}", tol_scale=10)
    plan, _ = fn.plan_for([x])
    dw = [k for k in plan.kernels if k.name.startswith("GEMV_")]
    assert len(dw) == 1, [k.name for k in plan.kernels]
