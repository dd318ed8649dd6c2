"""The C GEMM's k blocking on the `cpu` device: a task whose column chunk is narrow (at most gemm_c.NARROW_COLS
columns: 7x7 and 14x14 planes at batch 1) takes k in blocks of up to gemm_c.KC_NARROW, wider ones of up to
gemm_c.KC_MAX. Products and convolutions with several blocks of each kind (partial sums carried across blocks, fringe
columns, row tails), against NumPy in float64 and PyTorch."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen import gemm, gemm_c
from tests.helpers import assert_close, rand, run_gemm_kernel


def _run(spec: gemm.GemmSpec, a: np.ndarray, b: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    batch, m, n = out_shape
    return run_gemm_kernel("cpu", gemm.render_c(spec, {"MR": 8, "NR": 48}), batch, m, n, a, b)


@pytest.mark.parametrize(
    "m,n,k",
    [
        (13, 49, 2 * gemm_c.KC_NARROW + 37),  # narrow: three k blocks, a one-column fringe, a row tail
        (20, 96, gemm_c.KC_NARROW + 1),  # narrow: two panels, two k blocks
        (9, 1500, 3 * gemm_c.KC_MAX + 5),  # wide (4+ panels per task on 1 or 2 threads): four k blocks
    ],
)
def test_products_over_several_k_blocks_match_numpy(m, n, k):
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    a, b = rand((m, k), low=-1, high=1), rand((1, k, n), seed=1, low=-1, high=1)
    got = _run(spec, a, b, (1, m, n))
    want = np.einsum("mk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))
    assert_close(got, want, "float32", f"gemm {m}x{n}x{k}", tol_scale=10)


def test_narrow_product_keeps_inf_and_nan_in_their_rows_across_k_blocks():
    """An inf in the last k block and a NaN in the first reach only their own rows of C."""
    m, n, k = 11, 49, gemm_c.KC_NARROW + 300
    a, b = rand((m, k), low=-1, high=1), np.abs(rand((1, k, n), seed=1)) + 0.1
    a[3, k - 1], a[7, 0] = np.inf, np.nan
    spec = gemm.GemmSpec(1, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))
    got = _run(spec, a, b, (1, m, n))[0]
    with np.errstate(invalid="ignore"):
        want = a.astype(np.float64) @ b[0].astype(np.float64)
    assert np.isposinf(got[3]).all() and np.isnan(got[7]).all()
    rows = [i for i in range(m) if i not in (3, 7)]
    assert_close(got[rows], want[rows], "float32", "narrow gemm rows beside inf and NaN", tol_scale=10)


@pytest.mark.parametrize("cin,hw,stride", [(640, 7, 1), (576, 14, 2)])
def test_deep_convolutions_on_small_planes_match_torch(cin, hw, stride):
    """3x3 convolutions whose patch depth (9 * cin: 5760, 5184) spans two k blocks of the narrow size on a 7x7 output
    plane (implicit GEMM, Winograd off; patches gathered across block boundaries mid-channel), bias and ReLU fused."""
    x = rand((1, cin, hw, hw), low=-1, high=1)
    w, b = rand((24, cin, 3, 3), seed=1, low=-1, high=1) * 0.05, rand((24,), seed=2)
    wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wt, bt, stride=stride, padding=1).relu(), device="cpu")
    with settings.override(PLAIT_WINOGRAD="off"):
        got = np.asarray(f(x))
    plan, _ = f.plan_for([x])
    assert [kern.name.split("_")[0] for kern in plan.kernels] == ["CONV"]
    want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride, 1)
    assert_close(got, want.relu().numpy(), "float32", f"conv {cin} 3x3 s{stride} {hw}x{hw}", tol_scale=10)
