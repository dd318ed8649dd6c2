"""Winograd F(2,5)'s and F(4,5)'s transforms (plait/codegen/winograd_cl.py `F25`, `F45`) derived again from their
Cook-Toom points (0, 1, -1, 2, -2, then 1/2 and -1/2 for F(4,5), and infinity), and checked exactly in rational
arithmetic: A^T [(G g) . (B^T d)] equals the direct correlation of an (m + 4)-long input with a 5-tap filter, in one
dimension and nested over rows and columns (the 2-D sandwich the OpenCL kernels compute). F(2,3)'s and F(4,3)'s
matrices are checked the same way."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

from plait.codegen import winograd_c, winograd_cl

POINTS = [Fraction(p) for p in (0, 1, -1, 2, -2)] + [Fraction(1, 2), Fraction(-1, 2)]


def _cook_toom(m: int, r: int) -> tuple[list[list[Fraction]], list[list[Fraction]]]:
    """A^T (m x alpha) and G (alpha x r) of F(m, r) at POINTS and infinity: A^T evaluates the output polynomial's
    coefficients, G the filter's at each point divided by prod(p_j - p_l) (the Lagrange denominators)."""
    pts = POINTS[: m + r - 2]
    alpha = len(pts) + 1
    at = [[p**i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for p in pts:
        den = Fraction(1)
        for q in pts:
            den *= p - q if q != p else 1
        g.append([p**k / den for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    assert len(g) == alpha
    return at, g


def _as_lists(mat: winograd_c._Mat) -> list[list[Fraction]]:
    return [list(row) for row in mat]


@pytest.mark.parametrize("m", [2, 4])
def test_f_m5_matches_its_derivation(m: int) -> None:
    """A^T and G are the Cook-Toom ones, and B^T solves sum_j A^T[i][j] G[j][k] B^T[j][l] = [l == i + k] for every
    output i, tap k and input l: the bilinear identity that makes the algorithm a correlation, exactly."""
    bt, g, at = (_as_lists(x) for x in (winograd_cl.F25 if m == 2 else winograd_cl.F45))
    alpha = m + 4
    want_at, want_g = _cook_toom(m, 5)
    assert at == want_at and g == want_g
    assert len(bt) == alpha and all(len(row) == alpha for row in bt)
    for i in range(m):
        for k in range(5):
            for col in range(alpha):
                got = sum(at[i][j] * g[j][k] * bt[j][col] for j in range(alpha))
                assert got == int(col == i + k), (i, k, col)


def test_plans_take_their_matrices() -> None:
    """A plan's (m, r) picks F(2,3), F(4,3), F(2,5) or F(4,5), with alpha = m + r - 1 and alpha^2 products."""
    base = winograd_cl.WinogradCLPlan(1, 1, 1, 8, 8, 8, 8, 1, 1, (0, 64), (0, 9, 1))
    want = {(2, 3): winograd_c.TRANSFORMS[2], (4, 3): winograd_c.TRANSFORMS[4], (2, 5): winograd_cl.F25}
    want[(4, 5)] = winograd_cl.F45
    for (m, r), mats in want.items():
        plan = dataclasses.replace(base, m=m, r=r)
        assert plan.mats == mats and plan.alpha == m + r - 1 and plan.xis == (m + r - 1) ** 2


def _correlate_1d(bt, g, at, gv, dv):
    u = [sum(gr[k] * gv[k] for k in range(len(gv))) for gr in g]
    v = [sum(br[c] * dv[c] for c in range(len(dv))) for br in bt]
    return [sum(ar[j] * u[j] * v[j] for j in range(len(u))) for ar in at]


def _sandwich(mat, x):
    """mat @ x @ mat^T in Fractions."""
    rows = [[sum(mat[a][u] * x[u][v] for u in range(len(x))) for v in range(len(x[0]))] for a in range(len(mat))]
    return [[sum(rows[a][v] * mat[b][v] for v in range(len(x[0]))) for b in range(len(mat))] for a in range(len(mat))]


@pytest.mark.parametrize(("m", "r"), [(2, 3), (2, 5), (4, 5)])
def test_transforms_are_exact_correlations(m: int, r: int) -> None:
    """Random integer filters and input tiles: the 1-D and 2-D Winograd forms equal the direct correlation with no
    rounding at all."""
    bt, g, at = (_as_lists(x) for x in (winograd_cl.F45 if m == 4 else winograd_cl.TRANSFORMS[r]))
    alpha = m + r - 1
    rng = np.random.default_rng(r)
    for _ in range(20):
        gv = [Fraction(int(v)) for v in rng.integers(-9, 10, r)]
        dv = [Fraction(int(v)) for v in rng.integers(-9, 10, alpha)]
        want = [sum(gv[k] * dv[i + k] for k in range(r)) for i in range(m)]
        assert _correlate_1d(bt, g, at, gv, dv) == want
    for _ in range(5):
        g2 = [[Fraction(int(v)) for v in row] for row in rng.integers(-9, 10, (r, r))]
        d2 = [[Fraction(int(v)) for v in row] for row in rng.integers(-9, 10, (alpha, alpha))]
        u, v = _sandwich(g, g2), _sandwich(bt, d2)
        prod = [[u[a][b] * v[a][b] for b in range(alpha)] for a in range(alpha)]
        got = _sandwich(at, prod)
        want2 = [
            [sum(g2[p][q] * d2[i + p][j + q] for p in range(r) for q in range(r)) for j in range(m)] for i in range(m)
        ]
        assert got == want2
