"""TfIdfVectorizer over integer token ids: n-gram counts as sums of shifted equality tests, on the device.

Each pool n-gram of length n (within [min_gram_length, max_gram_length]) is matched at every start position and
every skip distance 1..max_skip_count+1 (unigrams once: skipping does not change them) by comparing n strided
slices of the row with its tokens; the per-n-gram counts become output columns through a constant one-hot GEMM,
then the TF / IDF / TFIDF weighting. String pools are not supported (plait has no string tensors).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, stack, where
from plait.onnx.importer import Ctx
from plait.onnx.ops import register


def _pool_ngrams(ctx: Ctx) -> list[tuple[tuple[int, ...], int]]:
    """(tokens, output column) of every pool n-gram whose length is counted."""
    pool = ctx.attr("pool_int64s")
    if pool is None:
        raise ctx.unsupported("string pools (pool_strings): plait has no string tensors; use pool_int64s")
    starts = list(ctx.attr("ngram_counts"))
    columns = list(ctx.attr("ngram_indexes"))
    lo, hi = int(ctx.attr("min_gram_length")), int(ctx.attr("max_gram_length"))
    out, gram_id = [], 0
    for size, begin in enumerate(starts, 1):
        end = starts[size] if size < len(starts) else len(pool)
        for at in range(begin, end - size + 1, size):
            if lo <= size <= hi:
                out.append((tuple(int(v) for v in pool[at : at + size]), int(columns[gram_id])))
            gram_id += 1
    return out


def _tfidf(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    if x.ndim not in (1, 2) or not x.dtype.is_int:
        raise ctx.error(f"input {x.shape} ({x.dtype.name}) must be 1-D or 2-D integer token ids")
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    length = rows.shape[1]
    width = max(int(v) for v in ctx.attr("ngram_indexes")) + 1
    skips = range(1, int(ctx.attr("max_skip_count", 0)) + 2)
    grams = _pool_ngrams(ctx)
    counts = []
    for tokens, _ in grams:
        n = len(tokens)
        total: Tensor | None = None
        for s in skips if n > 1 else (1,):
            span = length - (n - 1) * s  # start positions where the whole n-gram fits
            if span <= 0:
                continue
            hit = rows[:, 0:span] == tokens[0]
            for j in range(1, n):
                hit = hit & (rows[:, j * s : j * s + span] == tokens[j])
            c = hit.astype(dtypes.float32).sum(-1)
            total = c if total is None else total + c
        counts.append(total if total is not None else Tensor.zeros(rows.shape[0], device=x.device))
    onehot = np.zeros((len(grams), width), np.float32)
    for g, (_, col) in enumerate(grams):
        onehot[g, col] = 1.0
    freq = stack(counts, -1) @ ctx.t(onehot) if grams else Tensor.zeros(rows.shape[0], width, device=x.device)
    weights = ctx.attr("weights")
    w = ctx.t(np.asarray(weights, np.float32).reshape(1, -1)) if weights else None
    mode = ctx.attr("mode")
    if mode == "TF":
        y = freq
    elif mode == "IDF":
        y = where(freq > 0.0, w if w is not None else 1.0, 0.0)
    elif mode == "TFIDF":
        y = freq * w if w is not None else freq
    else:
        raise ctx.unsupported(f"mode {mode!r} (supported: TF, IDF, TFIDF)")
    return y.reshape(width) if x.ndim == 1 else y


register("TfIdfVectorizer", _tfidf)
