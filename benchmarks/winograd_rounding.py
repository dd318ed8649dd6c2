"""How coarsely Winograd F(m, r) rounds in float32, before anyone builds a kernel for it: the transforms are derived
exactly (Cook-Toom at the points 0, 1, -1, 2, -2, 1/2, -1/2, ... and infinity, B^T solved from the bilinear
identity in rational arithmetic), then a whole convolution runs through them in float32 with NumPy (weight and
input transforms, the alpha^2 channel products, the output transform) and is compared with PyTorch's float64
convolution. The direct float32 convolution is the baseline. Also prints each algorithm's products and the size of
its transformed tensors, for a layer's cost estimate.

    python benchmarks/winograd_rounding.py --layer 64,192,27,2 --batch 4 --algos 2x5,4x5,3x5
"""

from __future__ import annotations

import argparse
from fractions import Fraction

import numpy as np

POINTS = [Fraction(p) for p in (0, 1, -1, 2, -2)] + [Fraction(1, 2), Fraction(-1, 2), Fraction(3), Fraction(-3)]


def transforms(m: int, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B^T, G, A^T) of F(m, r) as float64 arrays, exact in Fractions: A^T evaluates the output polynomial at the
    points and infinity, G the filter divided by the Lagrange denominators, B^T solves sum_j A^T[i][j] G[j][k]
    B^T[j][l] = [l == i + k]."""
    pts = POINTS[: m + r - 2]
    alpha = m + r - 1
    at = [[p**i for p in pts] + [Fraction(int(i == m - 1))] for i in range(m)]
    g = []
    for p in pts:
        den = Fraction(1)
        for q in pts:
            den *= p - q if q != p else 1
        g.append([p**k / den for k in range(r)])
    g.append([Fraction(int(k == r - 1)) for k in range(r)])
    rows = [[at[i][j] * g[j][k] for j in range(alpha)] for i in range(m) for k in range(r)]
    bt = [[Fraction(0)] * alpha for _ in range(alpha)]
    for col in range(alpha):
        rhs = [Fraction(int(col == i + k)) for i in range(m) for k in range(r)]
        for j, v in enumerate(_solve(rows, rhs, alpha)):
            bt[j][col] = v
    for i in range(m):  # the identity holds exactly
        for k in range(r):
            for col in range(alpha):
                assert sum(at[i][j] * g[j][k] * bt[j][col] for j in range(alpha)) == int(col == i + k)
    return tuple(np.array([[float(v) for v in row] for row in mat]) for mat in (bt, g, at))  # type: ignore[return-value]


def _solve(rows: list[list[Fraction]], rhs: list[Fraction], n: int) -> list[Fraction]:
    """The solution of the consistent system rows @ x = rhs (n unknowns) by exact Gauss-Jordan elimination."""
    aug = [[*row, b] for row, b in zip(rows, rhs, strict=True)]
    piv_cols, r = [], 0
    for c in range(n):
        p = next((i for i in range(r, len(aug)) if aug[i][c] != 0), None)
        if p is None:
            continue
        aug[r], aug[p] = aug[p], aug[r]
        aug[r] = [v / aug[r][c] for v in aug[r]]
        for i in range(len(aug)):
            if i != r and aug[i][c] != 0:
                f = aug[i][c]
                aug[i] = [a - f * b for a, b in zip(aug[i], aug[r], strict=True)]
        piv_cols.append(c)
        r += 1
    assert all(all(v == 0 for v in row) for row in aug[r:]), "inconsistent system"
    x = [Fraction(0)] * n
    for i, c in enumerate(piv_cols):
        x[c] = aug[i][n]
    return x


def winograd_conv(x: np.ndarray, w: np.ndarray, pad: int, m: int) -> np.ndarray:
    """A stride-1 correlation of x (N, C, H, W) with w (K, C, r, r) through F(m, r), every step in float32."""
    n, c, h, wd = x.shape
    k, _, r, _ = w.shape
    bt, g, at = (t.astype(np.float32) for t in transforms(m, r))
    alpha = m + r - 1
    oh, ow = h + 2 * pad - r + 1, wd + 2 * pad - r + 1
    th, tw = -(-oh // m), -(-ow // m)
    xp = np.zeros((n, c, th * m + r - 1, tw * m + r - 1), np.float32)
    xp[:, :, pad : pad + h, pad : pad + wd] = x
    tiles = np.lib.stride_tricks.sliding_window_view(xp, (alpha, alpha), axis=(2, 3))[:, :, ::m, ::m]
    v = np.einsum("ia,nctuab,jb->ijcntu", bt, tiles, bt, optimize=True).astype(np.float32)
    u = np.einsum("ia,kcab,jb->ijkc", g, w.astype(np.float32), g, optimize=True).astype(np.float32)
    mm = np.matmul(u.reshape(alpha * alpha, k, c), v.reshape(alpha * alpha, c, -1)).astype(np.float32)
    mm = mm.reshape(alpha, alpha, k, n, th, tw)
    y = np.einsum("pi,ijkntu,qj->nktpuq", at, mm, at, optimize=True).astype(np.float32)
    return y.reshape(n, k, th * m, tw * m)[:, :, :oh, :ow]


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="64,192,27,2", help="input channels, output channels, image side, padding")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tile-batch", type=int, default=64, help="the batch whose tile counts and sizes are printed")
    ap.add_argument("--r", type=int, default=5)
    ap.add_argument("--algos", default="2x5,4x5,3x5", help="F(m, r) as m x r, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    c, k, side, pad = (int(v) for v in args.layer.split(","))
    rng = np.random.default_rng(args.seed)
    x = rng.standard_normal((args.batch, c, side, side)).astype(np.float32)
    w = (rng.standard_normal((k, c, args.r, args.r)) / np.sqrt(args.r * args.r * c)).astype(np.float32)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=pad).numpy()
    direct = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=pad).numpy()
    scale = float(np.abs(ref).max())
    out = side + 2 * pad - args.r + 1
    nb = args.tile_batch
    print(f"layer {c} -> {k} channels, {side}x{side}, {args.r}x{args.r} pad {pad}; error = max|err| / max|ref|")
    print(f"| algorithm | error | products (GFLOP at batch {nb}) | tiles | V MB | M MB |")
    print("|---|---|---|---|---|---|")
    print(
        f"| direct float32 | {np.abs(direct - ref).max() / scale:.2e} | {2 * nb * k * c * out * out * args.r**2 / 1e9:.1f} | | | |"
    )
    for algo in args.algos.split(","):
        m, r = (int(v) for v in algo.split("x"))
        if r != args.r:
            continue
        got = winograd_conv(x, w, pad, m)
        alpha, t = m + r - 1, nb * (-(-out // m)) ** 2
        print(
            f"| F({m},{r}) | {np.abs(got - ref).max() / scale:.2e} | {2 * alpha**2 * k * c * t / 1e9:.1f} | {t} | "
            f"{alpha**2 * c * t * 4 / 1e6:.0f} | {alpha**2 * k * t * 4 / 1e6:.0f} |"
        )


if __name__ == "__main__":
    main()
