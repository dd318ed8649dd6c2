"""The weight gradient of a training convolution (one GEMM with K = images x positions) split over K on devices
that split few-tile products, its operands chunked as views."""

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait.graph import autodiff
from plait.schedule.scheduler import schedule
from tests.helpers import assert_close, rand


def _weight_grad(device: str, n: int, c: int, hw: int, co: int):
    x = plait.tensor(rand((n, c, hw, hw), seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((co, c, 3, 3), seed=2), device=device, requires_grad=True)
    g = rand((n, co, hw, hw), seed=3)
    loss = (F.conv2d(x, w, padding=1) * plait.tensor(g, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    return autodiff.gradients(loss.node, seed, [w.node, x.node]), (x, w, g)


def test_weight_gradient_splits_over_images(monkeypatch) -> None:
    """Few output tiles (16 x 72) and K = 8 images x 256 positions: K is split into chunks read as views of the
    transposed output gradient and of the patch columns (no copy of either), then summed over the chunks. (The
    cpu's own weight-gradient kernel, which takes this layer there, is switched off: the graph is the folded one that
    devices splitting few-tile products get.)"""
    monkeypatch.setattr(F.conv_wgrad_c, "wins", lambda win: False)
    grads, (_, w, _) = _weight_grad("cpu", 8, 8, 16, 16)
    items = schedule([grads[w.node.uid]], 16, split_k=True)
    gemms = [it.gemm for it in items if it.kind == "gemm"]
    assert len(gemms) == 1 and gemms[0] is not None
    spec = gemms[0]
    assert spec.batch > 1 and spec.m == 16 and spec.n == 72 and spec.batch * spec.k == 8 * 256
    kinds = [it.kind for it in items]
    assert kinds.count("custom") == 1  # the im2col; nothing copies the patch columns


def test_weight_gradient_matches_torch(device: str) -> None:
    """The same gradients computed on each device (split over K where the device splits few-tile products)."""
    grads, (x, w, g) = _weight_grad(device, 8, 8, 16, 16)
    xt = torch.tensor(x.numpy(), requires_grad=True)
    wt = torch.tensor(w.numpy(), requires_grad=True)
    (torch.nn.functional.conv2d(xt, wt, padding=1) * torch.tensor(g)).sum().backward()
    gw, gx = plait.Tensor(grads[w.node.uid]), plait.Tensor(grads[x.node.uid])
    # each weight-gradient entry sums 2048 products (values up to ~150): float32 rounding of that order
    assert_close(gw.numpy(), wt.grad.numpy(), "float32", "conv2d weight gradient (split over K)", tol_scale=10)
    assert_close(gx.numpy(), xt.grad.numpy(), "float32", "conv2d input gradient")


def _bn_grads(device: str, shape: tuple[int, int, int, int]):
    x = plait.tensor(rand(shape, seed=1), device=device, requires_grad=True)
    w = plait.tensor(rand((shape[1],), seed=2), device=device, requires_grad=True)
    g = rand(shape, seed=3)
    out = F.batch_norm(x, None, None, w, None, training=True)
    loss = (out.relu() * plait.tensor(g, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    return autodiff.gradients(loss.node, seed, [x.node, w.node]), (x, w, g)


def test_batch_norm_channel_sums_split_on_wide_devices(monkeypatch) -> None:
    """Per-channel sums of a training batch norm (128 channels over 32768 values; cifar_cnn's 64 channels over
    16384) split into partial sums where reductions split 256 ways (OpenCL), and stay one pass per channel where
    they split 16 ways (cpu). The graph is built without the cpu's statistics kernels (nn.functional.bnstat_c), which
    take these sums there, so that it has the reductions other devices get."""
    monkeypatch.setattr(F.bnstat_c, "supports", lambda node: False)
    for shape in ((8, 128, 64, 64), (64, 64, 16, 16)):
        grads, (x, w, _) = _bn_grads("cpu", shape)
        wide = schedule([grads[x.node.uid], grads[w.node.uid]], 256)
        assert any(it.out.op == "rsplit" for it in wide), shape
    grads, (x, w, _) = _bn_grads("cpu", (8, 128, 64, 64))
    narrow = schedule([grads[x.node.uid], grads[w.node.uid]], 16)
    assert not any(it.out.op == "rsplit" for it in narrow)


def test_batch_norm_gradient_matches_torch(device: str) -> None:
    grads, (x, w, g) = _bn_grads(device, (16, 64, 64, 32))
    xt = torch.tensor(x.numpy(), requires_grad=True)
    wt = torch.tensor(w.numpy(), requires_grad=True)
    out = torch.nn.functional.batch_norm(xt, None, None, wt, None, training=True)
    (out.relu() * torch.tensor(g)).sum().backward()
    gx, gw = plait.Tensor(grads[x.node.uid]), plait.Tensor(grads[w.node.uid])
    # sums over 32768 values per channel: float32 rounding of that order in either framework
    assert_close(gw.numpy(), wt.grad.numpy(), "float32", "batch norm weight gradient", tol_scale=10)
    assert_close(gx.numpy(), xt.grad.numpy(), "float32", "batch norm input gradient", tol_scale=10)


def test_batch_norm_backward_reads_the_upstream_gradient_once(monkeypatch) -> None:
    """The gradient arriving at a training batch norm (here through a ReLU mask) is stored once and read by its
    per-channel sums, instead of being recomputed from the forward buffers inside each of them (the reductions other
    devices get: the cpu's statistics kernels are switched off)."""
    monkeypatch.setattr(F.bnstat_c, "supports", lambda node: False)
    grads, (x, w, _) = _bn_grads("cpu", (4, 16, 8, 8))
    items = schedule([grads[x.node.uid], grads[w.node.uid]], 16)
    masked = [it.out for it in items if it.kind == "elementwise" and it.out.op == "where"]  # dy * relu'(out)
    assert len(masked) == 1 and masked[0].shape == x.shape, [(it.kind, it.out.op) for it in items]
    sums = [it for it in items if it.kind == "reduce" and masked[0] in it.inputs]
    assert len(sums) >= 2


def _pointwise_grads(device: str, n: int, c: int, hw: int, co: int):
    x = plait.tensor(rand((n, c, hw, hw), seed=4), device=device, requires_grad=True)
    w = plait.tensor(rand((co, c, 1, 1), seed=5), device=device, requires_grad=True)
    g = rand((n, co, hw, hw), seed=6)
    loss = (F.conv2d(x, w) * plait.tensor(g, device=device)).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    return autodiff.gradients(loss.node, seed, [w.node, x.node]), (x, w, g)


def test_pointwise_weight_gradient_splits_within_images() -> None:
    """A 1x1 convolution's weight gradient over 32 images of 32 x 32 positions (mobilenet_v2's 16 x 32 outputs
    over K = images x positions at batch 64): no K chunk spanning images is a view of the NCHW input, so the
    chunks are quarters of one image's positions, a (32, 4) batch of GEMMs reading both operands in place."""
    grads, (_, w, _) = _pointwise_grads("cpu", 32, 32, 32, 16)
    items = schedule([grads[w.node.uid]], 16, split_k=True)
    gemms = [it.gemm for it in items if it.kind == "gemm"]
    assert len(gemms) == 1 and gemms[0] is not None
    spec = gemms[0]
    assert (spec.batch, spec.inner, spec.m, spec.n, spec.k) == (128, 4, 16, 32, 256)
    assert [it.kind for it in items].count("gemm") == 1 and not any(it.kind == "custom" for it in items)
    grads, (_, w, _) = _pointwise_grads("cpu", 32, 32, 32, 16)  # schedule() rewrites the graph it is given
    unsplit = schedule([grads[w.node.uid]], 16)
    assert [it.gemm.batch for it in unsplit if it.gemm is not None] == [1]


def test_pointwise_weight_gradient_matches_torch(device: str) -> None:
    """The same gradients on each device; 20 images of 20 x 20 positions keep whole images as chunks (400
    positions are not two chunks of 256 or more)."""
    for n, hw in ((32, 32), (20, 20)):
        grads, (x, w, g) = _pointwise_grads(device, n, 32, hw, 16)
        xt = torch.tensor(x.numpy(), requires_grad=True)
        wt = torch.tensor(w.numpy(), requires_grad=True)
        (torch.nn.functional.conv2d(xt, wt) * torch.tensor(g)).sum().backward()
        gw, gx = plait.Tensor(grads[w.node.uid]), plait.Tensor(grads[x.node.uid])
        what = f"1x1 conv2d weight gradient, {n} images of {hw}x{hw} (split within images)"
        # entries sum up to 32768 products (sums up to ~200, some cancelling to ~0.07): float32 rounding of ~1e-4
        assert_close(gw.numpy(), wt.grad.numpy(), "float32", what, tol_scale=100)
        assert_close(gx.numpy(), xt.grad.numpy(), "float32", "1x1 conv2d input gradient")
