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
    (2, 3, 8, 7, 3, 3, 2, 2, 1, 1, 1, 1),  # resnet's stride-2 3x3
    (1, 2, 6, 7, 2, 3, 3, 2, 2, 3, 1, 2),  # padding wider than a tap's reach, dilated columns, stride 3 x 2
    (2, 2, 5, 6, 1, 1, 2, 2, 0, 0, 1, 1),  # 1x1 stride 2: input pixels no column reads
    (1, 1, 3, 3, 3, 3, 1, 1, 3, 3, 1, 1),  # whole rows and columns of padding
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


@pytest.mark.parametrize("fold", [False, True], ids=["nck", "folded"])
@pytest.mark.parametrize("geo", [(2, 3, 6, 5, 3, 3, 2, 1, 1, 0, 1, 1), *GEOMETRIES])
def test_col2im_matches_fold(device, geo, fold):
    """col2im in both column layouts against torch.nn.functional.fold (the folded layout permuted back)."""
    n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw = geo
    win = Window(n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, fold=fold)
    ca = rand(win.cols_shape)
    out = Tensor(col2im(plait.tensor(ca, device=device).node, win))
    ct = torch.tensor(ca).permute(1, 0, 2) if fold else torch.tensor(ca)
    ref = torch.nn.functional.fold(ct, (h, w), (kh, kw), (dh, dw), (ph, pw), (sh, sw))
    assert_close(out.numpy(), ref.numpy(), "float32", "col2im")


def test_bad_geometry_is_a_plait_error():
    x = plait.tensor(np.zeros((1, 1, 2, 2), np.float32), device="cpu")
    with pytest.raises(plait.ShapeError, match="too small"):
        im2col(x.node, Window(1, 1, 2, 2, 5, 5))
    with pytest.raises(plait.ShapeError, match="does not match"):
        im2col(x.node, Window(1, 2, 2, 2, 1, 1))
