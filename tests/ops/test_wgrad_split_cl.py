"""Weight gradients of training convolutions on devices that split K (OpenCL): products with at least 64 x 64
outputs split into chunks that make enough 64x64 tiles, 1x1 layers of 14x14 images into one chunk per image, and
the tile heuristic gives such chunked products 64x64 tiles. Gradients are checked against PyTorch."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen.gemm import GemmSpec
from plait.graph import autodiff
from plait.graph.ops import conv_wgrad_c
from plait.schedule.scheduler import schedule
from plait.tune import _tc_heuristic, _weight_gradient
from tests.helpers import assert_close, rand


@pytest.fixture(autouse=True)
def _opencl_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graphs below are built on the cpu but scheduled as OpenCL schedules them (split K); the cpu's own direct
    weight-gradient kernel (conv_wgrad_c), which OpenCL never takes, is switched off so they keep OpenCL's form."""
    monkeypatch.setattr(conv_wgrad_c, "wins", lambda win: False)


def _grads(device: str, n: int, c: int, hw: int, co: int, k: int):
    x = plait.tensor(rand((n, c, hw, hw), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((co, c, k, k), seed=2), device=device, requires_grad=True)
    g = rand((n, co, hw, hw), seed=3)
    loss = (F.conv2d(x, w, padding=k // 2) * plait.tensor(g, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    return autodiff.gradients(loss.node, seed, [w.node, x.node]), (x, w, g)


def _gemms(n: int, c: int, hw: int, co: int, k: int) -> list[GemmSpec]:
    grads, (_, w, _) = _grads("cpu", n, c, hw, co, k)
    items = schedule([grads[w.node.uid]], 256, split_k=True)
    return [it.gemm for it in items if it.kind == "gemm" and it.gemm is not None]


def test_weight_gradient_splits_into_chunks_of_1024() -> None:
    """64 x 576 outputs over K = 16 images x 1024 positions: 16 chunks of 1024 (the 32x32-tile rule made 8)."""
    (spec,) = _gemms(16, 64, 32, 64, 3)
    assert (spec.batch, spec.inner, spec.m, spec.n, spec.k) == (16, 16, 64, 576, 1024)
    assert spec.a[3] == 1 and spec.b[2] == 1  # both operands read along K in place


def test_long_weight_gradient_with_few_outputs_splits() -> None:
    """mobilenet_v2's first layer (32 x 27 outputs, stride 2) over K = 64 images x 64 x 64 positions: few outputs,
    but K long enough for 256 chunks of 1024 (the 32x32-tile rule made 16 chunks of 16384)."""
    grads, (_, w, _) = _strided_grads(64, 3, 128, 32)
    items = schedule([grads[w.node.uid]], 256, split_k=True)
    (spec,) = [it.gemm for it in items if it.kind == "gemm" and it.gemm is not None]
    assert (spec.batch, spec.m, spec.n, spec.k) == (256, 32, 27, 1024)


def _strided_grads(n: int, c: int, hw: int, co: int):
    x = plait.tensor(np.zeros((n, c, hw, hw), np.float32), device="cpu", requires_grad=True)
    w = plait.tensor(rand((co, c, 3, 3), seed=2), device="cpu", requires_grad=True)
    loss = F.conv2d(x, w, stride=2, padding=1).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device="cpu").node
    return autodiff.gradients(loss.node, seed, [w.node, x.node]), (x, w, None)


def test_pointwise_weight_gradient_of_14x14_images_splits_per_image() -> None:
    """A 1x1 layer's 196 positions per image are shorter than a chunk of 256: one chunk per image."""
    (spec,) = _gemms(4, 64, 14, 64, 1)
    assert (spec.batch, spec.m, spec.n, spec.k) == (4, 64, 64, 196)


def test_heuristic_gives_weight_gradient_chunks_64x64_tiles() -> None:
    """resnet18 b64's first-stage weight gradient as 64 chunks (576 tiles of 64x64): 64x64 tiles, BK 32; a linear
    layer's split product (both operands along K too, but few tiles) keeps the other rules."""
    wgrad = GemmSpec(64, 64, 576, 3136, (0, 0, 200704, 1), (0, 0, 1, 200704), 64, 3136, 3136)
    assert _tc_heuristic(wgrad) == {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32}
    fc = GemmSpec(2, 64, 4096, 4608, (0, 0, 9216, 1), (0, 0, 1, 9216), 2, 4608, 4608)
    assert _weight_gradient(wgrad) and not _weight_gradient(fc)


@pytest.mark.parametrize("shape", [(8, 64, 16, 64, 3), (4, 64, 14, 64, 1)])
def test_split_weight_gradients_match_torch(device: str, shape: tuple[int, int, int, int, int]) -> None:
    n, c, hw, co, k = shape
    grads, (x, w, g) = _grads(device, n, c, hw, co, k)
    xt = torch.tensor(x.numpy(), requires_grad=True)
    wt = torch.tensor(w.numpy(), requires_grad=True)
    (torch.nn.functional.conv2d(xt, wt, padding=k // 2) * torch.tensor(g)).sum().backward()
    gw, gx = plait.Tensor(grads[w.node.uid]), plait.Tensor(grads[x.node.uid])
    # each weight-gradient entry sums n x hw x hw products (up to 2048, values up to ~150): float32 rounding
    assert_close(gw.numpy(), wt.grad.numpy(), "float32", f"conv2d {k}x{k} weight gradient (split)", tol_scale=10)
    # each input-gradient entry sums c x k x k products (values up to ~60; the cpu runs the 3x3 one as Winograd,
    # whose transforms add float32 rounding of ~4e-4 there: 1e-5 of the largest value)
    assert_close(gx.numpy(), xt.grad.numpy(), "float32", f"conv2d {k}x{k} input gradient", tol_scale=10 * k)


def _transposed_form(device: str, images: int, positions: int) -> tuple[plait.Tensor, np.ndarray]:
    """A weight gradient written (columns @ dy^T)^T: 576 patch rows and a 64-channel output gradient over K =
    images x positions, dy (images, 64, positions) read channel-major (no view of it is (64, K))."""
    cols = rand((576, images * positions), seed=7)
    g = rand((images, 64, positions), seed=8)
    dy = plait.tensor(g, device=device).permute(1, 0, 2).reshape(64, images * positions)
    wgrad = (plait.tensor(cols, device=device) @ dy.transpose(-1, -2)).transpose(-1, -2)
    want = g.transpose(1, 0, 2).reshape(64, -1).astype(np.float64) @ cols.T.astype(np.float64)
    return wgrad, want


def test_transposed_weight_gradient_form_splits() -> None:
    """The (columns @ dy^T)^T form is split as dy @ columns^T: the chunks read dy (realized once) and the columns
    in place: 64 x 576 outputs over K = 8 x 256 as 2 chunks of 1024 (as the dy @ columns^T form would)."""
    wgrad, _ = _transposed_form("cpu", 8, 256)
    items = schedule([wgrad.node], 256, split_k=True)
    (spec,) = [it.gemm for it in items if it.kind == "gemm" and it.gemm is not None]
    assert (spec.batch, spec.m, spec.n, spec.k) == (2, 64, 576, 1024)
    assert spec.a[3] == 1 and spec.b[2] == 1  # dy as A, the columns transposed as B, both read along K


def test_transposed_weight_gradient_form_matches_numpy(device: str) -> None:
    wgrad, want = _transposed_form(device, 4, 1024)
    # entries sum 4096 products of values up to ~1 (sums up to ~100, some cancelling to ~0.03): float32 rounding
    assert_close(wgrad.numpy(), want.astype(np.float32), "float32", "(columns @ dy^T)^T, split", tol_scale=100)
