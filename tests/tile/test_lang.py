"""The Tile language: aggregations, constraints, padding, elementwise parts, several contractions, derived
gradients (finite differences where PyTorch has no such op), errors at definition time, deterministic kernels."""

# ruff: noqa: E741  (Tile notation names tensors I, O, K)
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import plait
from plait import tile
from plait.codegen.c import CRenderer
from plait.codegen.opencl import OpenCLRenderer
from plait.tile import lib
from plait.tile.kernel import render_kernel
from tests.helpers import assert_close, check_op, rand


def finite_difference_check(fn: Any, arrays: list[np.ndarray], device: str, eps: float = 1e-2) -> None:
    """Gradients of sum(fn(*xs) * w) against central differences of the same plait function."""
    ts = [plait.tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(*ts)
    w = rand(out.shape, seed=7)
    (out * plait.tensor(w, device=device)).sum().backward()

    def loss(xs: list[np.ndarray]) -> float:
        with plait.no_grad():
            return float((fn(*(plait.tensor(x, device=device) for x in xs)).numpy().astype(np.float64) * w).sum())

    for i, (a, t) in enumerate(zip(arrays, ts)):
        assert t.grad is not None
        num = np.zeros(a.size)
        for j in range(a.size):
            plus, minus = [x.copy() for x in arrays], [x.copy() for x in arrays]
            plus[i].reshape(-1)[j] += eps
            minus[i].reshape(-1)[j] -= eps
            num[j] = (loss(plus) - loss(minus)) / (2 * eps)
        np.testing.assert_allclose(t.grad.numpy().reshape(-1), num, rtol=2e-2, atol=2e-2, err_msg=f"input {i}")


def test_maxplus_matmul(device: str) -> None:
    a, b = rand((3, 4), seed=1), rand((4, 5), seed=2)
    got = lib.maxplus_matmul(plait.tensor(a, device=device), plait.tensor(b, device=device)).numpy()
    assert_close(got, (a[:, :, None] + b[None]).max(axis=1), "float32", "max-plus forward")
    finite_difference_check(lib.maxplus_matmul, [a, b], device)


def test_morphological_dilation(device: str) -> None:
    x, k = rand((1, 2, 5, 4), seed=3), rand((2, 2, 3), seed=4)
    got = lib.morph_dilate2d(plait.tensor(x, device=device), plait.tensor(k, device=device), padding=1).numpy()
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    want = np.full((1, 2, 6, 4), -np.inf, np.float32)
    for ky in range(2):
        for kx in range(3):
            want = np.maximum(want, xp[:, :, ky : ky + 6, kx : kx + 4] + k[None, :, ky, kx, None, None])
    assert_close(got, want, "float32", "morphological dilation forward")
    finite_difference_check(lambda a, b: lib.morph_dilate2d(a, b, padding=1), [x, k], device)


@tile.op
def scaled_softplus_rowsum(A: Any, B: Any) -> Any:
    """Elementwise math inside a contraction, a constraint, and an elementwise epilogue on the result."""
    i, j, k = tile.indices("i j k")
    O = tile.output((A.shape[0], B.shape[1]))
    O[i, j] += (tile.log(1.0 + tile.exp(A[i, k])) * B[k, j]).constrain(k - i >= 0)
    return tile.relu(O * 2.0 - 1.0)


def test_elementwise_inside_and_after(device: str) -> None:
    def ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        mask = torch.triu(torch.ones(a.shape[0], a.shape[1]))
        return torch.relu((F_softplus(a) * mask) @ b * 2.0 - 1.0)

    check_op(scaled_softplus_rowsum, [(4, 6), (6, 3)], device, torch_fn=ref)


def F_softplus(a: torch.Tensor) -> torch.Tensor:
    return torch.log(1.0 + torch.exp(a))


@tile.op
def two_stage(A: Any, B: Any) -> Any:
    """Several contractions in one op: an accumulated output read by a second contraction."""
    i, j, k = tile.indices("i j k")
    T = tile.output((A.shape[0], A.shape[1]), name="T")
    T[i, k] += A[i, k] * A[i, k]
    T[i, k] += B[k, 0]
    O = tile.output((A.shape[0],), name="O")
    O[i] = tile.min(T[i, k] + B[k, j])
    return O


def test_several_contractions_and_min(device: str) -> None:
    def ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        t = a * a + b[:, 0][None, :]
        return (t[:, :, None] + b[None]).amin(dim=(1, 2))

    check_op(two_stage, [rand((3, 4), seed=5), rand((4, 3), seed=6)], device, torch_fn=ref)


@tile.op
def rowprod(A: Any) -> Any:
    i, k = tile.indices("i k")
    O = tile.output((A.shape[0],))
    O[i] *= A[i, k]
    return O


def test_product_aggregation(device: str) -> None:
    check_op(rowprod, [(3, 5)], device, torch_fn=lambda a: a.prod(dim=1), low=0.5, high=1.5)


@tile.op
def interleave(A: Any, B: Any) -> Any:
    """Plain assignment with affine output indices (no reduction)."""
    i = tile.index("i")
    O = tile.output((2 * A.shape[0],))
    O[2 * i] = A[i]
    O[2 * i + 1] = B[i]
    return O


def test_assignment_with_affine_output(device: str) -> None:
    check_op(interleave, [(5,), (5,)], device, torch_fn=lambda a, b: torch.stack([a, b], 1).reshape(-1))


@tile.op
def shifted_sum(A: Any) -> Any:
    """Reads outside the input excluded (no padding) versus read as a fill value."""
    i, k = tile.indices("i k")
    k3 = tile.index("w", 3)
    O = tile.output(A.shape, name="O")
    O[i] = tile.max(A[i + k3 - 1])
    P = tile.output(A.shape, name="P")
    P[i] = tile.max(A.padded(-5.0)[i + k3 - 1])
    Q = tile.output((1,), name="Q")
    Q[k - k] += A[k]
    return O, P, Q


def test_excluded_versus_padded_reads(device: str) -> None:
    a = np.array([-1.0, -2.0, -3.0, -4.0], np.float32)
    o, p, q = shifted_sum(plait.tensor(a, device=device))
    assert o.numpy().tolist() == [-1.0, -1.0, -2.0, -3.0]
    assert p.numpy().tolist() == [-1.0, -1.0, -2.0, -3.0]
    assert q.numpy().tolist() == [-10.0]
    b = np.array([-7.0, -8.0, -9.0], np.float32)
    assert shifted_sum(plait.tensor(b, device=device))[1].numpy().tolist() == [-5.0, -7.0, -5.0]


def test_fuses_with_elementwise_neighbours(device: str) -> None:
    x, w = rand((2, 3, 6, 6), seed=1), rand((4, 3, 3, 3), seed=2)
    out = (lib.conv2d(plait.tensor(x, device=device).relu(), plait.tensor(w, device=device), padding=1) + 1.0).relu()
    ref = torch.relu(torch.nn.functional.conv2d(torch.relu(torch.tensor(x)), torch.tensor(w), padding=1) + 1.0)
    assert_close(out.numpy(), ref.numpy(), "float32", "conv with fused neighbours")


def test_kernels_are_deterministic_and_tiled() -> None:
    def spec_node() -> Any:
        x = plait.tensor(rand((2, 8, 10, 10)), device="cpu")
        w = plait.tensor(rand((16, 8, 3, 3)), device="cpu")
        return lib.conv2d(x, w, padding=1).node

    n1, n2 = spec_node(), spec_node()
    for r in (CRenderer(), OpenCLRenderer()):
        k1 = render_kernel(r, n1, list(n1.srcs))
        k2 = render_kernel(r, n2, list(n2.srcs))
        assert k1.source == k2.source and k1.name == k2.name
        assert "acc[8][16]" in k1.source if r.dialect == "c" else "acc[4][4]" in k1.source
    a = plait.tensor(rand((64, 32)), device="cpu")
    mm = lib.matmul(a, a.T.reshape(32, 64).realize()).node
    assert render_kernel(CRenderer(), mm, list(mm.srcs)).name.startswith("GEMM")


# ---------------------------------------------------------------- errors at definition time


def _run(body: Any, *shapes: tuple[int, ...]) -> None:
    tile.op(body)(*(plait.tensor(rand(s), device="cpu") for s in shapes))


def test_error_non_affine() -> None:
    def body(A: Any) -> Any:
        i, j = tile.indices("i j")
        O = tile.output((3,))
        O[i] += A[i * j]

    with pytest.raises(plait.PlaitError, match=r"non-affine index expression \(i\) \* \(j\)"):
        _run(body, (9,))
    with pytest.raises(plait.TileError, match=r"non-affine.*i.*/"):
        _run(lambda A: A[tile.index("i") / 2], (4,))


def test_error_unbound_index() -> None:
    def body(A: Any) -> Any:
        i, k = tile.indices("i k")
        O = tile.output((3,))
        O[i] += A[i + k]

    with pytest.raises(plait.TileError, match=r"index 'k' is unbound in O\[i\] \+= A\[i \+ k\]"):
        _run(body, (5,))


def test_error_unused_index() -> None:
    def body(A: Any) -> Any:
        i, _ = tile.indices("i q")
        O = tile.output((3,))
        O[i] += A[i]
        return O

    with pytest.raises(plait.TileError, match="index 'q' is declared but used in no contraction"):
        _run(body, (3,))


def test_error_shapes_disagree() -> None:
    def body(A: Any, B: Any) -> Any:
        i, j, k = tile.indices("i j k")
        O = tile.output((2, 3))
        O[i, j] += A[i, k] * B[k, j]
        return O

    with pytest.raises(plait.TileError, match=r"index 'k' runs over 4 in dimension 1 of A\[i, k\] but over 5"):
        _run(body, (2, 4), (5, 3))


def test_error_constant_out_of_range() -> None:
    def body(A: Any) -> Any:
        i = tile.index("i")
        O = tile.output((3,))
        O[i] += A[i, 7]
        return O

    with pytest.raises(plait.TileError, match=r"constant index 7 is out of range for dimension 1 of A\[i, 7\]"):
        _run(body, (3, 4))


def test_error_mixed_aggregation() -> None:
    def body(A: Any) -> Any:
        i, k = tile.indices("i k")
        O = tile.output((3,))
        O[i] += A[i, k]
        O[i] = tile.max(A[i, k])
        return O

    with pytest.raises(plait.TileError, match=r"aggregation mixed within output O.*O\[i\] = max A\[i, k\]"):
        _run(body, (3, 4))


def test_error_wrong_rank_and_assignment_with_reduction() -> None:
    def rank(A: Any) -> Any:
        i = tile.index("i")
        O = tile.output((3,))
        O[i] += A[i]
        return O

    with pytest.raises(plait.TileError, match=r"A\[i\] has 1 indices but A has shape \(3, 4\)"):
        _run(rank, (3, 4))

    def assign(A: Any) -> Any:
        i, k = tile.indices("i k")
        O = tile.output((3,))
        O[i] = A[i, k]
        return O

    with pytest.raises(plait.TileError, match=r"plain assignment, but index 'k' does not appear in the output"):
        _run(assign, (3, 4))
