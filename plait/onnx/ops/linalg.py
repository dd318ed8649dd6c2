"""Det: Gaussian elimination with partial pivoting, unrolled over the (static) matrix size with plait ops.

Row swaps are rank-1 updates with one-hot rows chosen by an on-device argmax, so the whole batch of matrices is
factored on the device without a host round trip. The graph grows with n (about ten ops per column), which suits
the small matrices models use (2x2 to 8x8 transforms, covariance blocks).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.onnx.importer import Ctx
from plait.onnx.ops import register


def _det(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ctx.error(f"input {x.shape} must be (..., n, n)")
    n = x.shape[-1]
    a = x.astype(dtypes.float32)
    sign = Tensor.ones(*x.shape[:-2], dtype="float32", device=x.device)
    det = sign
    rows = ctx.t(np.arange(n, dtype=np.int64))
    for k in range(n):
        col = a[..., :, k].abs()
        col = where(ctx.t(np.arange(n) >= k), col, -1.0)  # rows above k are already pivots
        p = col.argmax(-1, keepdims=True)  # (..., 1)
        e_p = (rows == p).astype(dtypes.float32)  # (..., n) one-hot of the pivot row
        e_k = ctx.t((np.arange(n) == k).astype(np.float32))
        row_p = (a * e_p.unsqueeze(-1)).sum(-2)  # (..., n)
        row_k = a[..., k, :]
        diff = (row_p - row_k).unsqueeze(-2)
        a = a + e_k.reshape(n, 1) * diff - e_p.unsqueeze(-1) * diff  # swap rows k and p (no-op when p == k)
        sign = where(p.reshape(*sign.shape) == k, sign, -sign)
        pivot = a[..., k, k]
        det = det * pivot
        safe = where(pivot == 0.0, 1.0, pivot)
        factors = a[..., :, k] / safe.unsqueeze(-1)
        factors = where(ctx.t(np.arange(n) > k), factors, 0.0)  # eliminate below the pivot only
        a = a - factors.unsqueeze(-1) * a[..., k, :].unsqueeze(-2)
    return (det * sign).astype(x.dtype)


register("Det", _det)
