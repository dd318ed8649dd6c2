"""Sampling and geometry: GridSample (any rank; linear/nearest/cubic; zeros/border/reflection), AffineGrid,
RoiAlign, Col2Im, MaxUnpool.

The samplers compute their source coordinates and weights with elementwise plait ops on the device and read the
image with one row gather per interpolation tap (a (positions, channels) gather), so a grid or a box list
produced by the model itself stays on the device. Col2Im and MaxUnpool are additive and overwriting scatters.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from plait import dtypes
from plait.frontends.native.tensor import Tensor, where
from plait.graph.ops import indexing
from plait.onnx.importer import Ctx
from plait.onnx.ops import register
from plait.onnx.ops.elementwise import _round
from plait.onnx.ops.scatter import apply_scatter, strides

Value = Tensor | np.ndarray
F32 = dtypes.float32


def _rows(table: Tensor, row: Tensor) -> Tensor:
    """table[row] for a 2-D table and an integer index of any shape: shape row.shape + (table.shape[1],)."""
    flat = row.reshape(-1).astype(dtypes.int64)
    return Tensor(indexing.gather_rows(table.node, flat.node)).reshape(*row.shape, table.shape[1])


def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
    """v folded back into [lo, hi] by repeated reflection at the borders (GridSample's reflection padding)."""
    span = hi - lo
    if span <= 0:
        return v * 0.0 + lo
    below, above = lo - v, v - hi
    dx = where(v < lo, below, above)
    n = (dx / span).floor()
    r = dx - n * span
    even = (n * 0.5).floor() * 2.0 == n
    low_side = where(v < lo, even, even.logical_not())  # which border the folded value is measured from
    folded = where(low_side, lo + r, hi - r)
    return where((v < lo) | (v > hi), folded, v)


def _cubic_weights(t: Tensor) -> list[Tensor]:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    a = -0.75

    def near(x: Tensor) -> Tensor:  # |x| <= 1
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0

    def far(x: Tensor) -> Tensor:  # 1 < |x| < 2
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a

    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


def _tap_index(i: Tensor, size: int, padding: str, lo: float, hi: float) -> tuple[Tensor, Tensor | None]:
    """An integer tap position made readable: clamped (border), reflected (reflection) or, for zeros padding,
    clamped with a validity mask that zeroes the tap."""
    if padding == "zeros":
        valid = (i >= 0.0) & (i <= float(size - 1))
        return i.clip(0.0, float(size - 1)), valid
    if padding == "border":
        return i.clip(0.0, float(size - 1)), None
    return _reflect(i, lo, hi).astype(dtypes.int64).astype(F32).clip(0.0, float(size - 1)), None


def _grid_sample(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, grid = ctx.t(ins[0]), ctx.t(ins[1]).astype(F32)
    d = x.ndim - 2
    n, c, dims = x.shape[0], x.shape[1], x.shape[2:]
    if d < 1 or grid.ndim != d + 2 or grid.shape[0] != n or grid.shape[-1] != d:
        raise ctx.error(f"grid {grid.shape} does not fit input {x.shape} (need (N, *out, {d}))")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attr("mode", "linear"), ctx.attr("mode", "linear"))
    padding, align = ctx.attr("padding_mode", "zeros"), bool(ctx.attr("align_corners", 0))
    if mode not in ("linear", "nearest", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise ctx.unsupported(f"mode {mode!r} with padding_mode {padding!r}")
    out = grid.shape[1:-1]
    coords, bounds = [], []
    for i, size in enumerate(dims):
        g = grid[..., d - 1 - i]  # the grid lists coordinates innermost axis first (x, y, z)
        v = (g + 1.0) * (0.5 * (size - 1)) if align else ((g + 1.0) * size - 1.0) * 0.5
        lo, hi = (0.0, float(size - 1)) if align else (-0.5, size - 0.5)
        if mode == "nearest":
            v = _round(v)
        if padding == "border":
            v = where((v < lo) | (v > hi), v.clip(0.0, float(size - 1)), v)
        elif padding == "reflection":
            v = _reflect(v, lo, hi)
        coords.append(v)
        bounds.append((lo, hi))
    taps_per_axis: list[list[tuple[Tensor, Tensor | None, Tensor | None]]] = []
    for v, size, (lo, hi) in zip(coords, dims, bounds, strict=True):
        if mode == "nearest":
            base, offsets, weights = v.astype(dtypes.int64).astype(F32), [0], None
        else:
            base = v.floor()
            offsets = [0, 1] if mode == "linear" else [-1, 0, 1, 2]
            t = v - base
            weights = [1.0 - t, t] if mode == "linear" else _cubic_weights(t)
        axis_taps = []
        for j, off in enumerate(offsets):
            idx, valid = _tap_index(base + float(off), size, padding, lo, hi)
            axis_taps.append((idx, valid, weights[j] if weights is not None else None))
        taps_per_axis.append(axis_taps)
    table = x.permute(0, *range(2, d + 2), 1).reshape(-1, c)  # (N * prod(dims), C)
    st = strides(tuple(dims))
    batch = ctx.t((np.arange(n, dtype=np.int64) * math.prod(dims)).reshape((n,) + (1,) * len(out)))
    acc: Tensor | None = None
    for combo in itertools.product(*taps_per_axis):
        row = batch
        w: Tensor | None = None
        for (idx, valid, wt), s in zip(combo, st, strict=True):
            row = row + idx.astype(dtypes.int64) * s
            tw = wt
            if valid is not None:
                tw = where(valid, tw if tw is not None else 1.0, 0.0)
            if tw is not None:
                w = tw if w is None else w * tw
        vals = _rows(table, row).astype(F32)  # (N, *out, C)
        term = vals if w is None else vals * w.unsqueeze(-1)
        acc = term if acc is None else acc + term
    assert acc is not None
    return acc.permute(0, len(out) + 1, *range(1, len(out) + 1)).astype(x.dtype)


register("GridSample", _grid_sample)


def _affine_grid(ctx: Ctx, ins: list[Any]) -> Tensor:
    theta = ctx.t(ins[0]).astype(F32)
    size = ctx.ints(ins[1], "size")
    spatial = size[2:]
    d = len(spatial)
    if d not in (2, 3) or theta.shape[1:] != (d, d + 1):
        raise ctx.error(f"theta {theta.shape} and size {size} must be (N, 2, 3) with 4 sizes or (N, 3, 4) with 5")
    align = bool(ctx.attr("align_corners", 0))
    axes = []
    for s in spatial:
        if align:
            axes.append(np.linspace(-1.0, 1.0, s) if s > 1 else np.zeros(1))
        else:
            axes.append((2.0 * np.arange(s) + 1.0) / s - 1.0)
    mesh = np.meshgrid(*axes, indexing="ij")  # (D,) H, W
    homo = np.stack([*reversed([m.reshape(-1) for m in mesh]), np.ones(math.prod(spatial))], -1)  # x, y, (z), 1
    base = ctx.t(homo.astype(np.float32).reshape(1, -1, 1, d + 1))
    grid = (base * theta.reshape(theta.shape[0], 1, d, d + 1)).sum(-1)  # (N, positions, d)
    return grid.reshape(theta.shape[0], *spatial, d)


register("AffineGrid", _affine_grid)


def _col2im(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0])
    image, block = ctx.ints(ins[1], "image_shape"), ctx.ints(ins[2], "block_shape")
    d = len(image)
    dil = list(ctx.attr("dilations", [1] * d))
    pads = list(ctx.attr("pads", [0] * (2 * d)))
    stv = list(ctx.attr("strides", [1] * d))
    k = math.prod(block)
    if x.ndim != 3 or x.shape[1] % k:
        raise ctx.error(f"input {x.shape} must be (N, C * {k}, L) for block {block}")
    n, c = x.shape[0], x.shape[1] // k
    grid = [(image[i] + pads[i] + pads[i + d] - dil[i] * (block[i] - 1) - 1) // stv[i] + 1 for i in range(d)]
    if math.prod(grid) != x.shape[2]:
        raise ctx.error(f"input has {x.shape[2]} blocks but image {image} with these pads/strides gives {grid}")
    # image coordinate of every (block position, sliding position) pair on each axis
    pos = np.zeros((k, math.prod(grid)), np.int64)
    ok = np.ones((k, math.prod(grid)), bool)
    bi = np.array(list(np.ndindex(*block))).reshape(k, 1, d)
    li = np.array(list(np.ndindex(*grid))).reshape(1, -1, d)
    ist = strides(tuple(image))
    for i in range(d):
        coord = li[..., i] * stv[i] - pads[i] + bi[..., i] * dil[i]
        ok &= (coord >= 0) & (coord < image[i])
        pos += coord * ist[i]
    plane = math.prod(image)
    blocks = math.prod(grid)
    at = np.broadcast_to(np.where(ok, pos, -1).reshape(1, k * blocks), (n * c, k * blocks))  # -1: skipped
    zeros = Tensor.zeros(n * c, plane, dtype=x.dtype, device=x.device)
    return apply_scatter(ctx, zeros, at, x.reshape(n * c, k * blocks), "add").reshape(n, c, *image)


register("Col2Im", _col2im)


def _max_unpool(ctx: Ctx, ins: list[Any]) -> Tensor:
    x, idx = ctx.t(ins[0]), ins[1]
    d = x.ndim - 2
    kernel = list(ctx.attr("kernel_shape"))
    pads = list(ctx.attr("pads", [0] * (2 * d)))
    stv = list(ctx.attr("strides", [1] * d))
    inferred = [(x.shape[2 + i] - 1) * stv[i] - pads[i] - pads[i + d] + kernel[i] for i in range(d)]
    if tuple(idx.shape) != x.shape:
        raise ctx.error(f"indices {tuple(idx.shape)} must have the input's shape {x.shape}")
    planes, plane, count = x.shape[0] * x.shape[1], math.prod(inferred), math.prod(x.shape[2:])
    first = np.arange(planes, dtype=np.int64).reshape(planes, 1) * plane  # each plane's first flat index
    if isinstance(idx, np.ndarray):
        at: Value = idx.reshape(planes, count).astype(np.int64) - first
        if at.size and (at.min() < 0 or at.max() >= plane):
            raise ctx.error(f"an index points outside its own (n, c) plane of {inferred} (MaxPool indices do not)")
    else:
        at = idx.astype(dtypes.int64).reshape(planes, count) - ctx.t(first)  # outside its plane: skipped
    zeros = Tensor.zeros(planes, plane, dtype=x.dtype, device=x.device)
    y = apply_scatter(ctx, zeros, at, x.reshape(planes, count), "none").reshape(*x.shape[:2], *inferred)
    if len(ins) > 2 and ins[2] is not None:
        want = ctx.ints(ins[2], "output_shape")
        if len(want) != x.ndim or any(w < s for w, s in zip(want, y.shape, strict=True)):
            raise ctx.error(f"output_shape {want} is smaller than the unpooled shape {y.shape}")
        y = y.pad([(0, w - s) for w, s in zip(want, y.shape, strict=True)], 0.0)
    return y


register("MaxUnpool", _max_unpool)


def _roi_align(ctx: Ctx, ins: list[Any]) -> Tensor:
    x = ctx.t(ins[0]).astype(F32)
    if x.ndim != 4:
        raise ctx.error(f"input {x.shape} must be (N, C, H, W)")
    c, h, w = x.shape[1:]
    oh, ow = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    ratio, scale = int(ctx.attr("sampling_ratio", 0)), float(ctx.attr("spatial_scale", 1.0))
    mode = ctx.attr("mode", "avg")
    half = ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel")
    r = ins[1].shape[0]
    if tuple(ins[1].shape) != (r, 4) or tuple(ins[2].shape) != (r,):
        raise ctx.error(f"rois {tuple(ins[1].shape)} and batch_indices {tuple(ins[2].shape)} must be (R, 4), (R,)")
    off = 0.5 if half == "half_pixel" else 0.0
    if ratio > 0:
        rois: Tensor = ctx.t(ins[1]).astype(F32)
        gh = gw = ratio
        grid_h: Tensor | float = float(ratio)
        grid_w: Tensor | float = float(ratio)
    else:  # the sample count per bin depends on each box's size: read the boxes now
        hr = ctx.host(ins[1], "rois").astype(np.float64) * scale - off
        bh, bw = hr[:, 3] - hr[:, 1], hr[:, 2] - hr[:, 0]
        if half != "half_pixel":
            bh, bw = np.maximum(bh, 1.0), np.maximum(bw, 1.0)
        hh = np.maximum(np.ceil(bh / oh), 1).astype(np.int64)
        ww = np.maximum(np.ceil(bw / ow), 1).astype(np.int64)
        gh, gw = int(hh.max(initial=1)), int(ww.max(initial=1))
        rois = ctx.t(ctx.host(ins[1], "rois").astype(np.float32))
        grid_h = ctx.t(hh.astype(np.float32).reshape(r, 1, 1, 1, 1))
        grid_w = ctx.t(ww.astype(np.float32).reshape(r, 1, 1, 1, 1))
    box = rois * scale - off
    x0, y0 = box[:, 0].reshape(r, 1, 1, 1, 1), box[:, 1].reshape(r, 1, 1, 1, 1)
    rw, rh = box[:, 2].reshape(r, 1, 1, 1, 1) - x0, box[:, 3].reshape(r, 1, 1, 1, 1) - y0
    if half != "half_pixel":
        rw, rh = rw.maximum(1.0), rh.maximum(1.0)
    bin_h, bin_w = rh / float(oh), rw / float(ow)
    ph = ctx.t(np.arange(oh, dtype=np.float32).reshape(1, oh, 1, 1, 1))
    pw = ctx.t(np.arange(ow, dtype=np.float32).reshape(1, 1, ow, 1, 1))
    iy = ctx.t(np.arange(gh, dtype=np.float32).reshape(1, 1, 1, gh, 1))
    ix = ctx.t(np.arange(gw, dtype=np.float32).reshape(1, 1, 1, 1, gw))
    ys = y0 + ph * bin_h + (iy + 0.5) * bin_h / grid_h  # (R, oh, 1, gh, 1)
    xs = x0 + pw * bin_w + (ix + 0.5) * bin_w / grid_w  # (R, 1, ow, 1, gw)
    inside = (ys >= -1.0) & (ys <= float(h)) & (xs >= -1.0) & (xs <= float(w))
    taps_y, taps_x = _roi_taps(ys, h), _roi_taps(xs, w)
    batch = ctx.t(ins[2]).astype(dtypes.int64).reshape(r, 1, 1, 1, 1) * (h * w)
    table = x.permute(0, 2, 3, 1).reshape(-1, c)
    terms = []
    for (yi, wy), (xi, wx) in itertools.product(taps_y, taps_x):
        wgt = where(inside, wy * wx, 0.0)
        pos = batch + yi.astype(dtypes.int64) * w + xi.astype(dtypes.int64)
        vals = _rows(table, pos)  # (R, oh, ow, gh, gw, C)
        terms.append(vals * wgt.unsqueeze(-1))
    used = (iy < grid_h) & (ix < grid_w) if ratio <= 0 else None  # boxes with fewer samples than the widest
    if mode == "avg":
        total = terms[0] + terms[1] + terms[2] + terms[3]
        if used is not None:
            total = where(used.unsqueeze(-1), total, 0.0)
        count = grid_h * grid_w
        res = total.sum((3, 4)) / (count if isinstance(count, float) else count.reshape(r, 1, 1, 1))
    elif mode == "max":
        best = terms[0].maximum(terms[1]).maximum(terms[2]).maximum(terms[3])
        if used is not None:
            best = where(used.unsqueeze(-1), best, -math.inf)
        res = best.max((3, 4))
    else:
        raise ctx.unsupported(f"mode {mode!r} (supported: avg, max)")
    return res.permute(0, 3, 1, 2).astype(ctx.t(ins[0]).dtype)


def _roi_taps(v: Tensor, size: int) -> list[tuple[Tensor, Tensor]]:
    """The low and high bilinear taps of sample coordinates v on an axis of `size` (RoiAlign's edge rules: below
    0 reads 0, at or past the last pixel both taps are the last pixel)."""
    v = v.maximum(0.0)
    lo = v.floor()
    edge = lo >= float(size - 1)
    lo = where(edge, float(size - 1), lo)
    hi = where(edge, float(size - 1), lo + 1.0)
    frac = where(edge, 0.0, v - lo)
    return [(lo, 1.0 - frac), (hi, frac)]


register("RoiAlign", _roi_align)


def _nms(ctx: Ctx, ins: list[Any]) -> np.ndarray:
    """Greedy non-maximum suppression per (batch, class). The number of kept boxes depends on the scores, so the
    boxes and scores are read when the plan is built (a plan per distinct input value; docs/onnx.md, Limits)."""
    boxes, scores = ctx.host(ins[0], "boxes").astype(np.float64), ctx.host(ins[1], "scores").astype(np.float64)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[::2] != boxes.shape[:2]:
        raise ctx.error(f"boxes {boxes.shape} and scores {scores.shape} must be (B, N, 4) and (B, C, N)")

    def scalar(i: int, what: str, default: float) -> float:
        if len(ins) <= i or ins[i] is None or not ctx.host(ins[i], what).size:
            return default
        return float(ctx.host(ins[i], what).reshape(-1)[0])

    limit = max(int(scalar(2, "max_output_boxes_per_class", 0)), 0)
    iou_max, floor = scalar(3, "iou_threshold", 0.0), scalar(4, "score_threshold", -np.inf)
    if ctx.attr("center_point_box", 0):
        cx, cy, bw, bh = np.moveaxis(boxes, -1, 0)
        x0, x1, y0, y1 = cx - bw / 2, cx + bw / 2, cy - bh / 2, cy + bh / 2
    else:
        ya, xa, yb, xb = np.moveaxis(boxes, -1, 0)
        y0, y1, x0, x1 = np.minimum(ya, yb), np.maximum(ya, yb), np.minimum(xa, xb), np.maximum(xa, xb)
    area = (x1 - x0) * (y1 - y0)
    out = []
    for b, c in itertools.product(range(scores.shape[0]), range(scores.shape[1])):
        s = scores[b, c]
        order = [int(i) for i in np.argsort(-s, kind="stable") if s[i] > floor]
        kept: list[int] = []
        for i in order:
            if len(kept) >= limit:
                break
            if kept:
                k = np.array(kept)
                iw = np.minimum(x1[b, i], x1[b, k]) - np.maximum(x0[b, i], x0[b, k])
                ih = np.minimum(y1[b, i], y1[b, k]) - np.maximum(y0[b, i], y0[b, k])
                inter = np.where((iw > 0) & (ih > 0), iw * ih, 0.0)
                union = area[b, i] + area[b, k] - inter
                ok = (inter > 0) & (area[b, i] > 0) & (area[b, k] > 0) & (union > 0)
                if np.any(ok & (inter / np.where(ok, union, 1.0) > iou_max)):
                    continue
            kept.append(i)
            out.append((b, c, i))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


register("NonMaxSuppression", _nms, _nms)


def _deform_conv(ctx: Ctx, ins: list[Any]) -> Tensor:
    """A 2-D convolution whose taps read the input at learned offsets (bilinear, zero outside the image), scaled
    by an optional mask: the sampled columns are gathered on the device, then one grouped GEMM."""
    x, wt, offset = ctx.t(ins[0]), ctx.t(ins[1]), ctx.t(ins[2]).astype(F32)
    if x.ndim != 4:
        raise ctx.unsupported(f"input {x.shape}: only 2-D DeformConv (N, C, H, W) is implemented")
    n, c, hgt, wid = x.shape
    oc, cg, kh, kw = wt.shape
    group, ogroup = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    pads = list(ctx.attr("pads", [0, 0, 0, 0]))
    sh, sw = ctx.attr("strides", [1, 1])
    dh, dw = ctx.attr("dilations", [1, 1])
    oh, ow = offset.shape[2:]
    if cg * group != c or oc % group or c % ogroup or offset.shape[:2] != (n, ogroup * kh * kw * 2):
        raise ctx.error(
            f"shapes do not fit: X {x.shape}, W {wt.shape}, offset {offset.shape}, group {group}, offset_group {ogroup}"
        )
    off = offset.reshape(n, ogroup, kh, kw, 2, oh, ow)
    ky = ctx.t((np.arange(kh, dtype=np.float32) * dh).reshape(1, 1, kh, 1, 1, 1))
    kx = ctx.t((np.arange(kw, dtype=np.float32) * dw).reshape(1, 1, 1, kw, 1, 1))
    py = ctx.t((np.arange(oh, dtype=np.float32) * sh - pads[0]).reshape(1, 1, 1, 1, oh, 1))
    px = ctx.t((np.arange(ow, dtype=np.float32) * sw - pads[1]).reshape(1, 1, 1, 1, 1, ow))
    ys = off[:, :, :, :, 0] + ky + py  # (N, G, kh, kw, oh, ow)
    xs = off[:, :, :, :, 1] + kx + px
    per = c // ogroup
    table = x.reshape(n, ogroup, per, hgt, wid).permute(0, 1, 3, 4, 2).reshape(-1, per)
    plane = ctx.t((np.arange(n * ogroup, dtype=np.int64) * (hgt * wid)).reshape(n, ogroup, 1, 1, 1, 1))
    y0, x0 = ys.floor(), xs.floor()
    cols: Tensor | None = None
    for yi, wy in ((y0, 1.0 - (ys - y0)), (y0 + 1.0, ys - y0)):
        for xi, wx in ((x0, 1.0 - (xs - x0)), (x0 + 1.0, xs - x0)):
            ok = (yi >= 0.0) & (yi <= float(hgt - 1)) & (xi >= 0.0) & (xi <= float(wid - 1))
            row = plane + yi.clip(0.0, float(hgt - 1)).astype(dtypes.int64) * wid
            row = row + xi.clip(0.0, float(wid - 1)).astype(dtypes.int64)
            term = _rows(table, row).astype(F32) * where(ok, wy * wx, 0.0).unsqueeze(-1)
            cols = term if cols is None else cols + term
    assert cols is not None  # (N, G, kh, kw, oh, ow, per)
    if len(ins) > 4 and ins[4] is not None:
        cols = cols * ctx.t(ins[4]).astype(F32).reshape(n, ogroup, kh, kw, oh, ow).unsqueeze(-1)
    k = cg * kh * kw
    cols = cols.permute(0, 1, 6, 2, 3, 4, 5).reshape(n, group, k, oh * ow)  # channel-major, as W lays it out
    kernel = wt.astype(F32).reshape(1, group, oc // group, k)
    out = kernel @ cols  # (N, group, oc/group, oh*ow): one batched GEMM
    if len(ins) > 3 and ins[3] is not None:
        out = out + ctx.t(ins[3]).astype(F32).reshape(1, group, oc // group, 1)
    return out.reshape(n, oc, oh, ow).astype(x.dtype)


register("DeformConv", _deform_conv)
