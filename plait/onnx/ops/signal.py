"""Signal ops: DFT (opset 17 and 20 forms), STFT, Hann/Hamming/Blackman windows, MelWeightMatrix.

A DFT of length L is two products with constant L x K cosine and sine tables (a GEMM on the device), which is
exact to float32 rounding and fast for the frame sizes audio front ends use; it is not an O(L log L) FFT, so very
long transforms cost L^2 work. Windows and mel filter banks depend only on scalar sizes, so they are built on the
host as constants (a size from a graph input specialises the plan on its value).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, stack
from plait.onnx.importer import Ctx
from plait.onnx.loader import elem_np
from plait.onnx.ops import register
from plait.onnx.ops.sorting import axis_of, take

Value = Tensor | np.ndarray


def _tables(length: int, bins: int, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2*pi*n*k/length for n < length, k < bins (float32; k*n reduced mod length first so large
    products keep their accuracy), each row k optionally scaled by `weights`."""
    n = np.arange(length, dtype=np.int64)[:, None]
    k = np.arange(bins, dtype=np.int64)[None, :]
    theta = 2.0 * np.pi * ((n * k) % length) / length
    c, s = np.cos(theta), np.sin(theta)
    if weights is not None:
        c, s = c * weights[None, :], s * weights[None, :]
    return c.astype(np.float32), s.astype(np.float32)


def _fit(t: Tensor, length: int) -> Tensor:
    """t zero-padded or cropped on its last axis to `length` (np.fft's n argument)."""
    pairs = [(0, 0)] * (t.ndim - 1) + [(0, length - t.shape[-1])]
    return t.pad(pairs, 0.0) if length != t.shape[-1] else t


def dft_last(
    ctx: Ctx, re: Tensor, im: Tensor | None, length: int, inverse: bool, onesided: bool
) -> tuple[Tensor, Tensor | None]:
    """The DFT of (re + i*im) along the last axis as (real, imaginary) parts; the imaginary part is None for an
    inverse one-sided transform (irfft), whose result is real."""
    if inverse and onesided:
        bins = length // 2 + 1
        w = np.full(bins, 2.0)
        w[0] = 1.0
        if length % 2 == 0:
            w[-1] = 1.0
        c, s = _tables(length, bins, w / length)
        re_in = _fit(re, bins)
        out = re_in @ ctx.t(np.ascontiguousarray(c.T))
        if im is not None:
            out = out - _fit(im, bins) @ ctx.t(np.ascontiguousarray(s.T))
        return out, None
    bins = length // 2 + 1 if onesided else length
    c, s = _tables(length, bins)
    if inverse:
        c, s = c / length, -s / length
    ct, st = ctx.t(c), ctx.t(s)
    r = _fit(re, length)
    out_re, out_im = r @ ct, -(r @ st)
    if im is not None:
        i = _fit(im, length)
        out_re = out_re + i @ st
        out_im = out_im + i @ ct
    return out_re, out_im


def _dft(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0]).astype(dtypes.float32)
    nd = x.ndim
    if nd < 2 or x.shape[-1] not in (1, 2):
        raise ctx.error(f"input {x.shape} must end in a real (1) or complex (2) component axis")
    if ctx.opset >= 20:
        has_axis = len(ins) > 2 and ins[2] is not None
        a = int(ctx.host(ins[2], "axis").reshape(-1)[0]) if has_axis else -2
    else:
        a = int(ctx.attr("axis", 1))
    a = axis_of(ctx, a, nd)
    if a == nd - 1:
        raise ctx.error("axis must not be the last (component) axis")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    n = x.shape[a]
    if len(ins) > 1 and ins[1] is not None and ctx.host(ins[1], "dft_length").size:
        length = int(ctx.host(ins[1], "dft_length").reshape(-1)[0])
    else:
        length = 2 * (n - 1) if inverse and onesided else n
    if length < 1:
        raise ctx.error(f"dft_length {length} must be positive")
    moved = x.transpose(a, -2)  # (..., n, component)
    re = moved[..., 0]
    im = moved[..., 1] if x.shape[-1] == 2 else None
    out_re, out_im = dft_last(ctx, re, im, length, inverse, onesided)
    parts = [out_re] if out_im is None else [out_re, out_im]
    return stack(parts, -1).transpose(a, -2)  # (..., k, component); the swap puts k back on axis a


register("DFT", _dft)


def _stft(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0]).astype(dtypes.float32)
    if x.ndim != 3 or x.shape[-1] not in (1, 2):
        raise ctx.error(f"signal {x.shape} must be (batch, length, 1 or 2)")
    step = int(ctx.host(ins[1], "frame_step").reshape(-1)[0])
    window = ins[2] if len(ins) > 2 else None
    if len(ins) > 3 and ins[3] is not None:
        flen = int(ctx.host(ins[3], "frame_length").reshape(-1)[0])
    elif window is not None:
        flen = int(window.shape[0])
    else:
        raise ctx.error("needs a window or a frame_length")
    if window is not None and tuple(window.shape) != (flen,):
        raise ctx.error(f"window {tuple(window.shape)} must have frame_length {flen} entries")
    batch, length = x.shape[0], x.shape[1]
    if step < 1 or flen < 1 or flen > length:
        raise ctx.error(f"frame_step {step} and frame_length {flen} do not fit a signal of length {length}")
    frames = 1 + (length - flen) // step
    pos = (np.arange(frames)[:, None] * step + np.arange(flen)[None, :]).reshape(-1)
    framed = take(x, ctx.t(pos.astype(np.int64)), 1).reshape(batch, frames, flen, x.shape[-1])
    if window is not None:
        framed = framed * ctx.t(window).astype(dtypes.float32).reshape(1, 1, flen, 1)
    re = framed[..., 0]
    im = framed[..., 1] if x.shape[-1] == 2 else None
    out_re, out_im = dft_last(ctx, re, im, flen, False, bool(ctx.attr("onesided", 1)))
    assert out_im is not None
    return stack([out_re, out_im], -1)


register("STFT", _stft)


def _window(name: str) -> None:
    def fn(ctx: Ctx, ins: list[Any]) -> np.ndarray:
        size = int(ctx.host(ins[0], "size").reshape(-1)[0])
        if size < 0:
            raise ctx.error(f"size {size} must not be negative")
        span = size if ctx.attr("periodic", 1) else size - 1
        theta = 2.0 * np.pi * np.arange(size) / max(span, 1)
        if name == "HannWindow":
            w = 0.5 - 0.5 * np.cos(theta)
        elif name == "HammingWindow":
            alpha = 25.0 / 46.0
            w = alpha - (1.0 - alpha) * np.cos(theta)
        else:
            w = 0.42 - 0.5 * np.cos(theta) + 0.08 * np.cos(2.0 * theta)
        return w.astype(elem_np(int(ctx.attr("output_datatype", 1))))

    register(name, fn, fn)


for _name in ("HannWindow", "HammingWindow", "BlackmanWindow"):
    _window(_name)


def _mel_weight_matrix(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    """Triangular mel filters over the dft_length // 2 + 1 spectrogram bins (ONNX's bin placement: mel points
    spaced evenly between the edges, mapped back to Hz and floored onto bins)."""
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    mels, dft_len, rate, lo, hi = (ctx.host(v, n).reshape(-1)[0] for v, n in zip(ins, names, strict=True))
    mels, dft_len, rate = int(mels), int(dft_len), int(rate)
    if mels < 1 or dft_len < 1 or rate < 1 or not 0 <= float(lo) < float(hi):
        raise ctx.error(f"invalid sizes or edges: {dict(zip(names, (mels, dft_len, rate, lo, hi), strict=True))}")

    def to_mel(f: float) -> float:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    lo_mel, hi_mel = to_mel(float(lo)), to_mel(float(hi))
    points = np.arange(mels + 2) * ((hi_mel - lo_mel) / (mels + 2)) + lo_mel
    hz = 700.0 * (10.0 ** (points / 2595.0) - 1.0)
    edges = (((dft_len + 1) * hz) // rate).astype(np.int64)
    out = np.zeros((dft_len // 2 + 1, mels))
    for i in range(mels):
        left, mid, right = edges[i], edges[i + 1], edges[i + 2]
        if mid == left:
            out[mid, i] = 1.0
        else:
            j = np.arange(left, mid + 1)
            out[j, i] = (j - left) / (mid - left)
        if right > mid:
            j = np.arange(mid, right)
            out[j, i] = (right - j) / (right - mid)
    return out.astype(elem_np(int(ctx.attr("output_datatype", 1))))


register("MelWeightMatrix", _mel_weight_matrix, _mel_weight_matrix)
