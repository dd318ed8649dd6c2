"""A GEMM epilogue's operand of the product's full shape (a residual) is read at the element's linear index: the
per-axis coordinates (j / w, j % w) of an output plane merge back into j (ExprBuilder.linear), so the C compiler sees
a contiguous load instead of a gather per vector. Checked in the generated source and against PyTorch."""

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait.codegen.c import CRenderer
from plait.codegen.expr import ExprBuilder, Idx
from tests.helpers import assert_close, rand


def test_plane_coordinates_merge_into_the_linear_index():
    b = ExprBuilder(CRenderer(), {}, "int")
    coords = ["0", "(i0 + i)", "((j0 + j) / 12)", "((j0 + j) % 12)"]
    assert b.linear(Idx((1, 8, 12, 12), coords=coords)) == "i1"
    assert b.lines == ["int i1 = (i0 + i) * 144 + (j0 + j);"]
    # a quotient by another extent, or strides that do not nest, stay per axis
    b = ExprBuilder(CRenderer(), {}, "int")
    b.linear(Idx((1, 8, 12, 10), coords=["0", "(i0 + i)", "((j0 + j) / 12)", "((j0 + j) % 10)"]))
    assert b.lines == ["int i1 = (i0 + i) * 120 + ((j0 + j) / 12) * 10 + ((j0 + j) % 10);"]


def test_residual_epilogue_reads_contiguously_and_matches_torch():
    x, r = rand((1, 32, 12, 12), low=-1, high=1), rand((1, 16, 12, 12), seed=3)
    w, bias = rand((16, 32, 1, 1), seed=1) * 0.2, rand((16,), seed=2)
    wp, bp, rp = (plait.tensor(a, device="cpu") for a in (w, bias, r))
    f = plait.jit(lambda t: (F.conv2d(t, wp, bp) + rp).relu(), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    src = "".join(k.source for k in plan.kernels)
    assert "/ 12) * 12" not in src and "(j0 + j) / 12" not in src
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(bias))
    assert_close(got, (want + torch.from_numpy(r)).relu().numpy(), "float32", "1x1 conv + residual + relu")
