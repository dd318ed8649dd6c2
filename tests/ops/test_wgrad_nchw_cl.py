"""Weight gradients on OpenCL reading the output gradient dy in place from its NCHW buffer: the (C, N*P) rows a
folded convolution's weight gradient multiplies are a permuted view of that buffer, which op by op was copied once
more in that layout. K runs that cross images gather through `GemmSpec.a_nchw`; runs within one image's plane are a
strided view. Kernels against NumPy, schedules, and whole gradients against PyTorch."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm
from plait.codegen.gemm import GemmSpec
from plait.errors import UnsupportedError
from plait.graph import autodiff
from plait.graph.ops import conv_wgrad_c
from plait.graph.ops.conv import Window
from plait.schedule.scheduler import _nchw_spec, schedule
from tests.conftest import DEVICES
from tests.helpers import assert_close, rand
from tests.ops.test_conv_gather_train_cl import KNOBS, OPENCL_FLAGS, _columns, _run

CL_DEVICES = [d for d in DEVICES if d.startswith("opencl")]


@pytest.fixture(autouse=True)
def _opencl_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schedule tests build their graphs on the cpu but schedule them as OpenCL does; the cpu's own direct
    weight-gradient kernel (conv_wgrad_c), which OpenCL never takes, is switched off so they keep OpenCL's form."""
    monkeypatch.setattr(conv_wgrad_c, "wins", lambda win: False)


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("knobs", [KNOBS[0], KNOBS[3], KNOBS[4]])  # the 3xTF32 twin and both FP32 templates
@pytest.mark.parametrize("chunks", [1, 5])
def test_weight_gradient_reads_dy_from_nchw(device: str, knobs: dict[str, int], chunks: int) -> None:
    """dy given as NCHW (3 images of 5x5, 20 channels), read as (20, 75) rows of which 2..18 make the product's
    A, whole or as 5 K chunks of 15 (some crossing an image); B gathers the columns of a 3x3 window."""
    win = Window(3, 4, 5, 5, 3, 3, 1, 1, 1, 1, fold=True)
    p, span, rows = 25, 75, 36
    x = rand((3, 4, 5, 5), seed=4)
    dy_nchw = rand((3, 20, 5, 5), seed=5)
    dy = dy_nchw.transpose(1, 0, 2, 3).reshape(20, span)
    cols = _columns(x, win)
    m, row0 = 16, 2
    batch, kc = chunks, span // chunks
    spec = GemmSpec(batch, m, rows, kc, (row0 * span, kc, span, 1), (0, kc, 1, span), conv_t=win, a_nchw=(p, 20 * p))
    got = _run(device, spec, knobs, dy_nchw, x)
    want = np.stack(
        [dy[row0 : row0 + m, s * kc : (s + 1) * kc] @ cols[:, s * kc : (s + 1) * kc].T for s in range(batch)]
    )
    assert_close(got, want, "float32", f"a_nchw GEMM {knobs}, {batch} chunks", tol_scale=10)


def test_c_gemm_refuses_nchw_a() -> None:
    spec = GemmSpec(1, 16, 8, 50, (0, 0, 50, 1), (0, 0, 8, 1), a_nchw=(25, 400))
    with pytest.raises(UnsupportedError, match="a_nchw"):
        gemm.render_c(spec)


def _relu_step(device: str, n: int, c: int, hw: int, co: int, k: int, stride: int, pad: int):
    """conv2d -> relu -> a weighted sum: the convolution's output gradient is an expression (the ReLU mask times
    the weights), not a leaf."""
    x = plait.tensor(rand((n, c, hw, hw), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((co, c, k, k), seed=2), device=device, requires_grad=True)
    y = F.conv2d(x, w, stride=stride, padding=pad)
    g = rand(y.shape, seed=3)
    loss = (F.relu(y) * plait.tensor(g, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    return x, w, g, autodiff.gradients(loss.node, seed, [w.node, x.node])


def _dy_copies(items: list) -> list:
    """Kernels writing the output gradient (32 channels) permuted to (C, N*P)."""
    return [it for it in items if it.kind == "elementwise" and it.out.op == "reshape" and it.out.shape[-2:-1] == (32,)]


def test_stride_one_weight_gradient_reads_dy_in_place() -> None:
    """Stride 1: the input gradient reads dy as NCHW and the weight gradient's chunks read that buffer too (across
    images through a_nchw, whole images as a strided view); no (C, N*P) copy is made, for a 1x1 layer on OpenCL
    neither of dy nor of the input gradient. Stride 2: the input gradient's column product reads the copy, so it
    stays."""
    x, w, _, grads = _relu_step("cpu", 4, 8, 12, 32, 3, 1, 1)
    items = schedule([grads[w.node.uid], grads[x.node.uid]], 256, **OPENCL_FLAGS)
    wgrads = [it for it in items if it.gemm is not None and it.gemm.conv_t is not None]
    assert wgrads and not _dy_copies(items)
    assert all(it.inputs[0].shape == (4, 32, 12, 12) for it in wgrads)
    x, w, _, grads = _relu_step("opencl", 4, 8, 12, 32, 1, 1, 0)  # 1x1: the input gradient is a 1x1 convolution
    items = schedule([grads[w.node.uid], grads[x.node.uid]], 256, **OPENCL_FLAGS)
    assert not _dy_copies(items) and not [it for it in items if it.kind == "elementwise" and it.out.shape == x.shape]
    x, w, _, grads = _relu_step("cpu", 4, 8, 12, 32, 3, 2, 1)
    items = schedule([grads[w.node.uid], grads[x.node.uid]], 256, **OPENCL_FLAGS)
    assert _dy_copies(items)
    assert not [it for it in items if it.gemm is not None and it.gemm.a_nchw is not None]


@pytest.mark.parametrize("device", CL_DEVICES)
@pytest.mark.parametrize("geo", [(3, 4, 10, 24, 3, 1, 1), (2, 8, 9, 32, 1, 1, 0), (2, 3, 7, 20, 5, 1, 2)])
def test_gradients_match_torch(device: str, geo: tuple[int, ...]) -> None:
    n, c, hw, co, k, stride, pad = geo
    x, w, g, grads = _relu_step(device, n, c, hw, co, k, stride, pad)
    got = [plait.Tensor(grads[w.node.uid]).numpy(), plait.Tensor(grads[x.node.uid]).numpy()]
    xt = torch.tensor(x.numpy(), dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w.numpy(), dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.conv2d(xt, wt, stride=stride, padding=pad)
    (torch.relu(yt) * torch.tensor(g, dtype=torch.float64)).sum().backward()
    for what, have, want in zip(("weight gradient", "input gradient"), got, (wt.grad, xt.grad), strict=True):
        assert_close(have, want.detach().numpy().astype(np.float32), "float32", f"conv2d {geo} {what}", tol_scale=20)


@pytest.mark.parametrize("device", CL_DEVICES)
def test_pointwise_convolutions_after_max_pool_match_torch(device: str) -> None:
    """Two 1x1 convolutions reading a max pool's output (resnet's first bottleneck and its downsampling): the pool's
    output is a reshape that the columns' reshape folds away, so the input gradient keeps the columns' form there
    (a contribution to a node off the graph would be lost); the gradients below the pool against torch."""
    xs, ws = rand((2, 8, 8, 8), seed=1), [rand(s, seed=i) for i, s in enumerate([(8, 8, 3, 3), (16, 8, 1, 1)], 2)]
    gs = [rand((2, 16, 4, 4), seed=5), rand((2, 8, 4, 4), seed=6)]

    def grads(lib: str) -> list[np.ndarray]:
        if lib == "torch":
            leaves = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (xs, *ws)]
            conv, pool, relu, const = (
                torch.nn.functional.conv2d,
                torch.nn.functional.max_pool2d,
                torch.relu,
                torch.tensor,
            )
        else:
            leaves = [plait.tensor(v, device=device, requires_grad=True) for v in (xs, *ws)]
            conv, pool, relu = F.conv2d, F.max_pool2d, F.relu

            def const(v: np.ndarray) -> plait.Tensor:
                return plait.tensor(v, device=device)

        x, w0, w1 = leaves
        h = pool(relu(conv(x, w0, padding=1)), 3, 2, 1)
        loss = (relu(conv(h, w1)) * const(gs[0])).sum() + (conv(h, w0[:, :, 1:2, 1:2]) * const(gs[1])).sum()
        loss.backward()
        return [np.asarray(v.grad.numpy(), np.float32) for v in leaves]

    for what, have, want in zip(("x", "w0", "w1"), grads("plait"), grads("torch"), strict=True):
        assert_close(have, want, "float32", f"{what} through 1x1 convolutions after a max pool", tol_scale=20)


def test_wide_products_crossing_images_keep_the_copy() -> None:
    """vgg16 b64's 56x56 layer: chunks of two images in the 128x128-tile products keep reading the (C, N*P) copy
    (the per-float gather measured slower than the copy), narrower products gather across images, chunks within
    one image read the NCHW buffer as a strided view."""
    span, plane, image = 64 * 3136, 3136, 256 * 3136
    win = Window(64, 256, 56, 56, 3, 3, 1, 1, 1, 1, fold=True)
    wide = GemmSpec(32, 256, 2304, 6272, (0, 6272, span, 1), (0, 6272, 1, span), conv_t=win)
    assert _nchw_spec(wide, plane, image, span) is None
    narrow = dataclasses.replace(wide, m=64, n=576)
    assert _nchw_spec(narrow, plane, 64 * plane, span) == dataclasses.replace(narrow, a_nchw=(plane, 64 * plane))
    within = GemmSpec(64, 256, 2304, 3136, (0, 3136, span, 1), (0, 3136, 1, span), conv_t=win)
    assert _nchw_spec(within, plane, image, span) == dataclasses.replace(within, a=(0, image, plane, 1))
