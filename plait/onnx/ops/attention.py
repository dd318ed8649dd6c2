"""Attention (opset 23+) and the loss ops (NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss), BitShift.

Attention takes 3-D (batch, seq, heads*size) or 4-D (batch, heads, seq, size) Q/K/V, an optional bool or additive
mask, a KV cache (past_key/past_value, returned concatenated as present_*) or an external one (nonpad_kv_seqlen),
grouped-query heads, causal masking, sliding windows, a scale and a softcap. Class picks in the losses are one-hot
compares summed over the class axis (no gather). BitShift right is a floor division, exact in integers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import plait.nn.functional as F
from plait import dtypes
from plait.frontends.native.tensor import Tensor, cat, where
from plait.onnx.importer import Ctx
from plait.onnx.ops import register


def _heads_and_scale(ctx: Any, k: Any, v: Any, hq: int) -> tuple[Any, Any, float]:
    """K and V with one head per query head (grouped-query attention: each kv head serves hq // hk consecutive
    query heads), and the score scale (the `scale` attribute, else 1/sqrt(head size))."""
    b, hk, skv, e = k.shape
    if hq != hk:
        rep = hq // hk
        k = k.unsqueeze(2).expand(b, hk, rep, skv, e).reshape(b, hq, skv, e)
        v = v.unsqueeze(2).expand(b, hk, rep, skv, v.shape[-1]).reshape(b, hq, skv, v.shape[-1])
    scale = ctx.attr("scale")
    return k, v, float(scale) if scale is not None else 1.0 / math.sqrt(e)


def _heads(x: Tensor, n: int | None) -> Tensor:
    if x.ndim == 4:
        return x
    b, s, hidden = x.shape
    assert n is not None
    return x.reshape(b, s, n, hidden // n).permute(0, 2, 1, 3)


def _attention(ctx: Ctx, ins: list[Any]) -> list[Any]:
    ins = ins + [None] * (7 - len(ins))
    q3 = ctx.t(ins[0])
    qn, kvn = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    q, k, v = _heads(q3, qn), _heads(ctx.t(ins[1]), kvn), _heads(ctx.t(ins[2]), kvn)
    past = 0
    if ins[4] is not None:
        past = ctx.t(ins[4]).shape[2]
        k = cat([ctx.t(ins[4]).astype(k.dtype), k], 2)
    if ins[5] is not None:
        v = cat([ctx.t(ins[5]).astype(v.dtype), v], 2)
    present_k, present_v = k, v
    b, hq, sq, _ = q.shape
    skv = k.shape[2]
    k, v, scale = _heads_and_scale(ctx, k, v, hq)
    qf, kf, vf = q.astype(dtypes.float32), k.astype(dtypes.float32), v.astype(dtypes.float32)
    qk = (qf @ kf.transpose(-2, -1)) * scale
    cap = float(ctx.attr("softcap", 0.0))
    if cap > 0.0:  # before the mask, so that masked scores stay -inf
        qk = (qk / cap).tanh() * cap
    bias = _bias(ctx, ins[3], ins[6], b, sq, skv, past)
    scores = qk if bias is None else qk + bias
    probs = F.softmax(scores, -1)
    if bias is not None:  # a query row that may attend no key gives 0 (softmax of all -inf would be NaN)
        probs = where(bias.max(-1, True) == -math.inf, 0.0, probs)
    y = (probs @ vf).astype(q.dtype)
    if q3.ndim == 3:
        y = y.permute(0, 2, 1, 3).reshape(b, sq, -1)
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    shown = probs if mode == 3 else scores if mode == 2 else qk
    return [y, present_k, present_v, shown.astype(q.dtype)]


def _bias(ctx: Ctx, mask: Any, nonpad: Any, b: int, sq: int, skv: int, past: int) -> Tensor | None:
    """The additive attention bias (0 where a query may attend a key, -inf where not): the mask (bool or additive,
    padded with "masked" up to the key length), then the causal and sliding-window limits, then the padding of
    an external KV cache. Query i sits at key position i + offset: past_key's length with an internal cache,
    nonpad_kv_seqlen[b] - sq with an external one, else 0."""
    bias = None
    if mask is not None:
        m = ctx.t(mask)
        if m.shape[-1] < skv:
            fill = False if m.dtype == dtypes.bool_ else -math.inf
            m = m.pad([(0, 0)] * (m.ndim - 1) + [(0, skv - m.shape[-1])], fill)
        bias = where(m, 0.0, -math.inf) if m.dtype == dtypes.bool_ else m.astype(dtypes.float32)
    lengths = ctx.t(nonpad).astype(dtypes.int64).reshape(b, 1, 1, 1) if nonpad is not None else None
    i = np.arange(sq, dtype=np.int64)[:, None]
    j = np.arange(skv, dtype=np.int64)[None, :]
    # diff[.., i, j] = (query position) - (key position)
    diff = ctx.t(i - j) + (lengths - sq) if lengths is not None else ctx.t(i - j + past)
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    limits = []
    if ctx.attr("is_causal", 0):
        limits.append(diff >= 0)
    if left >= 0:
        limits.append(diff <= left)
    if right >= 0:
        limits.append(diff >= -right)
    if lengths is not None:
        limits.append(ctx.t(j.reshape(1, 1, 1, skv)) < lengths)
    for ok in limits:
        add = where(ok, 0.0, -math.inf)
        bias = add if bias is None else bias + add
    return bias


register("Attention", _attention)


def _flex_attention(ctx: Ctx, ins: list[Any]) -> Tensor:
    """ai.onnx.preview FlexAttention: 4-D scaled dot-product attention (grouped-query heads allowed) whose scores
    and probabilities pass through the optional `score_mod` and `prob_mod` subgraphs, each a function of the whole
    (batch, heads, q, kv) tensor. Computed in float32, returned in V's type."""
    q, k, v = (ctx.t(x) for x in ins[:3])
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ctx.error(
            f"FlexAttention takes rank-4 Q, K, V (batch, heads, seq, size), got {q.shape}, {k.shape}, {v.shape}"
        )
    _, hq, _, e = q.shape
    hk, skv = k.shape[1], k.shape[2]
    if hq % hk or v.shape[1] != hk or v.shape[2] != skv or k.shape[3] != e:
        raise ctx.error(f"FlexAttention: Q {q.shape}, K {k.shape} and V {v.shape} do not fit together")
    k, v, scale = _heads_and_scale(ctx, k, v, hq)
    scores = (q.astype(dtypes.float32) @ k.astype(dtypes.float32).transpose(-2, -1)) * scale
    if ctx.attr("score_mod") is not None:
        scores = ctx.t(ctx.run_graph(ctx.attr("score_mod"), [scores])[0]).astype(dtypes.float32)
    probs = F.softmax(scores, -1)
    if ctx.attr("prob_mod") is not None:
        probs = ctx.t(ctx.run_graph(ctx.attr("prob_mod"), [probs])[0]).astype(dtypes.float32)
    return (probs @ v.astype(dtypes.float32)).astype(v.dtype)


register("FlexAttention", _flex_attention)


def _pick(ctx: Ctx, x: Tensor, target: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """(one-hot of target over axis 1 of x, as x's dtype; the mask of targets not equal to ignore_index)."""
    shape = [1] * x.ndim
    shape[1] = c
    classes = ctx.t(np.arange(c, dtype=np.int64).reshape(shape))
    t = target.astype(dtypes.int64).unsqueeze(1)
    onehot = (t == classes).astype(x.dtype)
    ignore = ctx.attr("ignore_index")
    keep = (target != int(ignore)) if ignore is not None else (target == target)
    return onehot, keep.astype(x.dtype)


def _nll(ctx: Ctx, logp: Tensor, target: Tensor, weight: Any) -> Tensor:
    c = logp.shape[1]
    onehot, keep = _pick(ctx, logp, target, c)
    picked = (logp * onehot).sum(1)
    if weight is not None:
        wshape = [1] * logp.ndim
        wshape[1] = c
        w = ((ctx.t(weight).reshape(*wshape) * onehot).sum(1)) * keep
    else:
        w = keep
    loss = -picked * w
    red = ctx.attr("reduction", "mean")
    if red == "none":
        return loss
    if red == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


register(
    "NegativeLogLikelihoodLoss",
    lambda ctx, ins: _nll(ctx, ctx.t(ins[0]), ctx.t(ins[1]), ins[2] if len(ins) > 2 else None),
)


def _sce(ctx: Ctx, ins: list[Any]) -> list[Tensor]:
    scores = ctx.t(ins[0])
    logp = F.log_softmax(scores.astype(dtypes.float32), 1).astype(scores.dtype)
    loss = _nll(ctx, logp, ctx.t(ins[1]), ins[2] if len(ins) > 2 else None)
    return [loss, logp]


register("SoftmaxCrossEntropyLoss", _sce)


def _bitshift(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, y = ctx.t(ins[0]), ctx.t(ins[1]).astype(ctx.t(ins[0]).dtype)
    if ctx.attr("direction") == "LEFT":
        return x * Tensor.full((), 2, x.dtype, x.device) ** y
    # arithmetic shift right = floor division by 2**y; a shift below 0 or past the sign bit leaves only the sign
    width = 8 * x.dtype.itemsize
    inside = (y >= 0) & (y < width - 1)
    p = Tensor.full((), 2, x.dtype, x.device) ** where(inside, y, 0)
    return where(inside, _floor_div_exact(x, p), where(x < 0, -1, 0).astype(x.dtype))


def _floor_div_exact(x: Tensor, p: Tensor) -> Tensor:
    """floor(x / p) for integer tensors and p > 0, exact over the whole int32/int64 range: a float32 quotient is
    refined by the (exact, integer) remainder until it is off by at most one, then fixed up."""
    q = (x.float() / p.float()).floor().astype(x.dtype)
    for _ in range(3 if x.dtype == dtypes.int64 else 1):
        q = q + ((x - q * p).float() / p.float()).floor().astype(x.dtype)
    r = x - q * p
    return q - (r < 0).astype(x.dtype) + (r >= p).astype(x.dtype)


register("BitShift", _bitshift)
