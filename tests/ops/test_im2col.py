"""im2col/col2im (the implicit-GEMM operands of convolution) against torch.nn.functional.unfold, with gradients."""

import numpy as np
import pytest
import torch

import plait
from plait.frontends.native.tensor import Tensor
from plait.graph.ops.conv import Window, col2im, im2col
from tests.helpers import assert_close, rand

GEOMETRIES = [  # n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw
    (2, 3, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1),
    (1, 4, 9, 9, 3, 2, 2, 1, 0, 1, 2, 1),
    (2, 2, 5, 5, 1, 1, 1, 1, 0, 0, 1, 1),
]


@pytest.mark.parametrize("fold", [False, True], ids=["nck", "folded"])
@pytest.mark.parametrize("geo", GEOMETRIES)
def test_im2col_matches_unfold(device, geo, fold):
    """Both column layouts: (N, C*kh*kw, P) and, folded, (C*kh*kw, N, P); the gradient is col2im in that layout."""
    n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw = geo
    win = Window(n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, fold=fold)
    xa = rand((n, c, h, w))
    x = plait.tensor(xa, device=device, requires_grad=True)
    cols = Tensor(im2col(x.node, win))
    xt = torch.tensor(xa, requires_grad=True)
    ref = torch.nn.functional.unfold(xt, (kh, kw), (dh, dw), (ph, pw), (sh, sw))
    if fold:
        ref = ref.permute(1, 0, 2)
    assert_close(cols.numpy(), ref.detach().numpy(), "float32", "im2col")
    g = rand(cols.shape, seed=7)
    (cols * plait.tensor(g, device=device)).sum().backward()
    (ref * torch.tensor(g)).sum().backward()
    assert x.grad is not None
    assert_close(x.grad.numpy(), xt.grad.numpy(), "float32", "col2im (gradient of im2col)")


def test_col2im_matches_fold(device):
    win = Window(2, 3, 6, 5, 3, 3, 2, 1, 1, 0, 1, 1)
    ca = rand(win.cols_shape)
    out = Tensor(col2im(plait.tensor(ca, device=device).node, win))
    ref = torch.nn.functional.fold(torch.tensor(ca), (6, 5), (3, 3), 1, (1, 0), (2, 1))
    assert_close(out.numpy(), ref.numpy(), "float32", "col2im")


def test_bad_geometry_is_a_plait_error():
    x = plait.tensor(np.zeros((1, 1, 2, 2), np.float32), device="cpu")
    with pytest.raises(plait.ShapeError, match="too small"):
        im2col(x.node, Window(1, 1, 2, 2, 5, 5))
    with pytest.raises(plait.ShapeError, match="does not match"):
        im2col(x.node, Window(1, 2, 2, 2, 1, 1))
