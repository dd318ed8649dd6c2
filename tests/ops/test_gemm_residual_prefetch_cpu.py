"""The cpu GEMM's epilogue prefetches the next row block of an operand as large as C (a residual) while that block's
products run (gemm_c.epi_prefetch). A hint changes no result: checked against PyTorch where the rows end in a
partial block (the prefetch stops at the last row), over a batch (each image's offset), for a product whose images
merge into one (the epilogue then runs per tile) and for an implicit-GEMM convolution."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import gemm_c
from tests.helpers import assert_close, rand

CASES = [  # n, cin, h, w, cout, kernel, stride, padding
    (2, 24, 24, 24, 37, 1, 1, 0),  # 576 columns per image (not merged), 37 rows: a partial last row block
    (2, 16, 10, 10, 40, 1, 1, 0),  # 100 columns per image: both images' columns merge into one product
    (2, 8, 15, 15, 20, 3, 2, 1),  # stride-2 3x3: patch columns gathered from the image (implicit GEMM)
]


@pytest.mark.parametrize("case", CASES, ids=["rows", "merged", "conv"])
def test_residual_epilogue_with_prefetch_matches_torch(case):
    n, cin, h, w, cout, k, s, p = case
    x = rand((n, cin, h, w), low=-1, high=1)
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    wt, b, r = rand((cout, cin, k, k), seed=1) * 0.2, rand((cout,), seed=2), rand((n, cout, oh, ow), seed=3)
    wp, bp, rp = (plait.tensor(a, device="cpu") for a in (wt, b, r))
    f = plait.jit(lambda t: (F.conv2d(t, wp, bp, stride=s, padding=p) + rp).relu(), device="cpu")
    got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    sources = [kern.source for kern in plan.kernels if "plait_sgemm_" in kern.source]
    assert len(sources) == 1 and "__builtin_prefetch(e" in sources[0], [kern.name for kern in plan.kernels]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), torch.from_numpy(b), s, p)
    assert_close(got, (want + torch.from_numpy(r)).relu().numpy(), "float32", f"conv + residual {case}", tol_scale=10)


def test_prefetch_statements_cover_the_next_row_block():
    src = gemm_c.epi_prefetch(["e2"], 37, 576)
    assert "i < i0 + 2 * mr && i < 37" in src and "bz * 21312L + (long)i * 576 + j0" in src
    assert "__builtin_prefetch(e2 + o + j)" in src and gemm_c.epi_prefetch([], 37, 576) == ""
