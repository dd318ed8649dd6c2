"""The `cpu` device's depthwise convolution kernel (DWCONV): stride-1 planes whose output keeps the input's size read
in place with masked loads (7x7 to wide planes, dilation, non-square kernels, rows narrower than a vector or not a
multiple of it, several images); other stride-1 planes row by row from a zero-padded copy (rows longer than one
64-output block, a partial vector) or, with rows of 10-28 outputs, in 64-output runs spanning their rows; and the
kernel that runs a vector's width of planes across the vector lanes (small, very narrow or strided planes, in strips
of rows: strides 2 and 3, dilation, non-square kernels, partial groups, groups spanning images), with a fused BN-style
epilogue and ReLU6, against PyTorch. The masked kernel needs AVX-512 and 16-float vectors; at other widths
(PLAIT_CPU_VECTOR) its geometries take the other kernels."""

from types import SimpleNamespace

import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c
from tests.helpers import assert_close, rand

GEOMETRIES = [  # n, c, h, w, kh, kw, stride, padding, dilation
    (1, 3, 80, 67, 3, 3, 1, 1, 1),  # stride 1 plane by plane, rows of 67 (a 64-output block and a partial one)
    (2, 4, 33, 150, 3, 3, 1, 1, 1),  # rows of 150: three 64-output blocks
    (1, 2, 70, 70, 3, 3, 1, 2, 2),  # stride 1 plane by plane, dilation 2
    (1, 3, 70, 70, 3, 3, 2, 1, 1),  # stride 2 across the lanes: a partial group, several strips
    (1, 2, 41, 83, 3, 3, 2, 0, 1),  # stride 2 without padding, odd width
    (1, 2, 29, 66, 5, 5, 2, 2, 2),  # stride 2, dilation 2
    (2, 3, 21, 50, 3, 5, (1, 3), (1, 2), 1),  # stride 3 along rows, non-square kernel
    (1, 3, 400, 12, 3, 3, 1, 1, 1),  # a tall plane narrower than a vector: 64-output runs over many rows
    (1, 5, 7, 7, 3, 3, 1, 1, 1),  # a 7x7 plane across the lanes
    (1, 6, 9, 15, 5, 3, 1, (2, 0), (1, 2)),  # rows of 11: dilation along rows, no side padding, non-square kernel
    (2, 7, 13, 20, 3, 3, 1, 1, 1),  # rows of 20 in runs spanning rows, two images
    (1, 4, 14, 14, 3, 3, 2, 1, 1),  # 14 -> 7, stride 2
    (2, 10, 14, 14, 3, 3, 1, 1, 1),  # 14x14 planes in runs spanning rows, two images
    (1, 18, 30, 30, 3, 3, 1, 1, 1),  # across the lanes in three strips of output rows
    (1, 5, 28, 28, 3, 3, 1, 1, 1),  # rows of 28 in runs spanning rows
    (1, 21, 9, 11, 5, 3, (2, 1), (2, 0), (1, 2)),  # small planes: a partial group, strides, dilation, no side padding
    (1, 17, 3, 3, 3, 3, 2, 1, 1),  # 2x2 outputs: fewer than one block of eight
    (1, 2, 80, 67, 3, 3, 1, 0, 1),  # no padding (output narrower than the input): row by row
    (1, 3, 30, 30, 3, 3, 1, 0, 1),  # no padding, rows of 28: runs spanning rows
    (1, 17, 9, 9, 3, 3, 1, 0, 1),  # no padding, 7x7 outputs: across the lanes (16-float vectors), else flat runs
    (1, 9, 8, 8, 3, 3, 1, 0, 1),  # no padding, 6x6 outputs: across the lanes at every vector width
    (2, 3, 20, 1, 3, 3, 1, 1, 1),  # masked: one-column planes (every side tap in the padding)
    (1, 2, 9, 17, 5, 3, 1, (2, 1), 1),  # masked: non-square kernel, rows of 17 (a row across every vector)
    (3, 2, 16, 16, 3, 3, 1, 1, 1),  # masked: rows of exactly one vector, planes of 16 vectors over three images
    (1, 1, 182, 182, 3, 3, 1, 1, 1),  # too many masks for the stack: row by row
    (1, 2, 3, 1001, 3, 3, 1, 1, 1),  # masked: rows of 1001, a mask period longer than the plane
]


@pytest.mark.parametrize("geo", GEOMETRIES)
def test_depthwise_matches_torch(geo):
    n, c, h, w, kh, kw, stride, padding, dilation = geo
    x, wt = rand((n, c, h, w)), rand((c, 1, kh, kw), seed=1)
    scale, shift = rand((c,), seed=2), rand((c,), seed=3)

    def fn(t: plait.Tensor) -> plait.Tensor:
        y = F.conv2d(t, plait.tensor(wt, device="cpu"), None, stride, padding, dilation, c)
        y = y * plait.tensor(scale, device="cpu").reshape(c, 1, 1) + plait.tensor(shift, device="cpu").reshape(c, 1, 1)
        return y.clip(0.0, 6.0)

    jit = plait.jit(fn, device="cpu")
    plan, _ = jit.plan_for([x])
    assert [k.name.split("_")[0] for k in plan.kernels] == ["DWCONV"], [k.name for k in plan.kernels]
    tx = torch.tensor(x)
    ref = torch.nn.functional.conv2d(tx, torch.tensor(wt), None, stride, padding, dilation, c)
    ref = (ref * torch.tensor(scale).reshape(c, 1, 1) + torch.tensor(shift).reshape(c, 1, 1)).clamp(0.0, 6.0)
    assert_close(jit(x), ref.numpy(), "float32", f"depthwise {geo}", tol_scale=10)


@pytest.mark.parametrize(
    ("stride", "hw", "pad", "at16", "narrower"),
    [
        (2, 14, 1, "lanes", "lanes"),
        ((1, 2), 112, 1, "lanes", "lanes"),
        (1, 7, 1, "masked", "flat"),
        (1, 14, 1, "masked", "flat"),
        (1, 56, 1, "masked", "rows"),
        (1, 112, 1, "masked", "rows"),
        (1, 182, 1, "rows", "rows"),
        (1, 8, 0, "lanes", "lanes"),
        (1, 9, 0, "lanes", "flat"),
        (1, 16, 0, "flat", "flat"),
        (1, 58, 0, "lanes", "rows"),
        (1, 114, 0, "rows", "rows"),
    ],
)
def test_depthwise_kernel_pick(stride, hw, pad, at16, narrower):
    """Strided layers run across the vector lanes. With 16-float vectors stride-1 ones whose output keeps the input's
    size read in place with masked loads (up to a limit on the masks); other stride-1 ones with rows of 10-28 outputs
    in runs spanning rows, narrower rows and planes up to 56x56 across the lanes, wider planes row by row. With
    narrower vectors (no masked kernel) rows of 7-28 outputs run flat, narrower ones across the lanes, wider planes
    row by row."""
    sh, sw = stride if isinstance(stride, tuple) else (stride, stride)
    oh, ow = (hw + 2 * pad - 3) // sh + 1, (hw + 2 * pad - 3) // sw + 1
    win = SimpleNamespace(sh=sh, sw=sw, h=hw, w=hw, kh=3, kw=3, oh=oh, ow=ow)
    assert gemm_c.dw_kernel(win) == (at16 if gemm_c.VW == 16 else narrower)
