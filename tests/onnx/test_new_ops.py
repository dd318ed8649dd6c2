"""ONNX scatters, sorting, signal, geometry and transformer ops (plait/onnx/ops/scatter.py, sorting.py, signal.py,
geometry.py, linalg.py, transformer.py) against onnx's ReferenceEvaluator, on every device.

Covers what the node tests do not: indices known at import time (range-checked then) as well as computed ones,
reductions on other ranks and axes, N-d sampling modes the node tests skip, adaptive RoiAlign sampling, complex
and odd-length DFTs, plans specialised on data-dependent shapes, and the errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from plait.errors import PlaitError
from plait.onnx import InferenceSession
from plait.onnx.errors import OnnxModelError

_ELEM = {np.dtype(np.float32): T.FLOAT, np.dtype(np.int64): T.INT64, np.dtype(np.bool_): T.BOOL}


def _model(
    node: onnx.NodeProto,
    feed: dict[str, np.ndarray],
    consts: dict[str, np.ndarray],
    n_out: int = 1,
    opset: int = 21,
    out_types: list[Any] | None = None,
) -> bytes:
    """A one-node model whose outputs are typed like `out_types` (arrays, or (elem, shape) pairs); by default one
    float output of symbolic rank-2 shape, for models that must fail before their output matters."""
    inputs = [h.make_tensor_value_info(k, _ELEM[v.dtype], v.shape) for k, v in feed.items()]
    types = [
        (h.np_dtype_to_tensor_dtype(t.dtype), t.shape) if isinstance(t, np.ndarray) else t for t in out_types or []
    ]
    types = types or [(T.FLOAT, ["a", "b"])] * n_out
    outputs = [h.make_tensor_value_info(o, e, sh) for o, (e, sh) in zip(node.output[:n_out], types, strict=True)]
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in consts.items()]
    g = h.make_graph([node], "g", inputs, outputs, initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10).SerializeToString()


def _check(
    device: str,
    node: onnx.NodeProto,
    feed: dict[str, np.ndarray],
    consts: dict[str, np.ndarray] | None = None,
    n_out: int = 1,
    opset: int = 21,
    tol: float = 1e-5,
) -> InferenceSession:
    want = ReferenceEvaluator(_model(node, feed, consts or {}, n_out, opset)).run(None, feed)
    sess = InferenceSession(_model(node, feed, consts or {}, n_out, opset, want), device=device)
    got = sess.run(None, feed)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)
    return sess


RNG = np.random.default_rng(7)


def _f(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
    return RNG.uniform(lo, hi, shape).astype(np.float32)


# ---------------------------------------------------------------- scatters


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_device_indices(device, reduction):
    data, upd = _f(2, 5, 3), _f(2, 4, 3)
    idx = RNG.integers(-5, 5, (2, 4, 3))  # negative positions and duplicates
    if reduction == "none":  # no duplicates along the axis (ONNX leaves their order undefined without a reduction)
        idx = np.stack([RNG.permutation(5)[:4] for _ in range(6)], -1).reshape(4, 2, 3).transpose(1, 0, 2)
    node = h.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction=reduction)
    _check(device, node, {"d": data, "i": idx.astype(np.int64), "u": upd})


def test_scatter_elements_host_indices_and_range_error(device):
    data, upd = _f(3, 4), _f(3, 2)
    idx = np.array([[0, -1], [2, 2], [3, 1]], np.int64)
    node = h.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction="add", name="se")
    _check(device, node, {"d": data, "u": upd}, {"i": idx})
    bad = _model(node, {"d": data, "u": upd}, {"i": np.array([[0, 4], [0, 0], [0, 0]], np.int64)})
    with pytest.raises(OnnxModelError, match=r"'se'.*index 4 is out of range for size 4"):
        InferenceSession(bad, device=device).run(None, {"d": data, "u": upd})


@pytest.mark.parametrize("host", [True, False])
def test_scatter_nd_slices_mul(device, host):
    data, upd = _f(4, 3, 2), _f(3, 2)
    idx = np.array([[1, 0], [3, 2], [1, 0]], np.int64)  # a repeated slice: the products accumulate
    node = h.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction="mul")
    feed = {"d": data, "u": upd} if host else {"d": data, "u": upd, "i": idx}
    _check(device, node, feed, {"i": idx} if host else None)


def test_tensor_scatter_circular(device):
    cache, upd = _f(2, 3, 5, 4), _f(2, 3, 3, 4)
    node = h.make_node("TensorScatter", ["c", "u", "w"], ["y"], mode="circular", axis=2)
    _check(device, node, {"c": cache, "u": upd, "w": np.array([4, 1], np.int64)}, opset=24)


# ---------------------------------------------------------------- sorting, scans and selection


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_middle_axis_with_ties(device, largest):
    x = RNG.integers(0, 4, (2, 9, 3)).astype(np.float32)
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)
    _check(device, node, {"x": x}, {"k": np.array([4], np.int64)}, n_out=2)


def test_cumprod_int_reverse_exclusive(device):
    x = RNG.integers(-3, 4, (3, 4, 2)).astype(np.int64)
    node = h.make_node("CumProd", ["x", "a"], ["y"], exclusive=1, reverse=1)
    _check(device, node, {"x": x}, {"a": np.array(1, np.int64)}, opset=26)


def test_reverse_sequence_device_lengths(device):
    x = _f(5, 3, 2)
    node = h.make_node("ReverseSequence", ["x", "l"], ["y"], time_axis=0, batch_axis=1)
    _check(device, node, {"x": x, "l": np.array([5, 1, 3], np.int64)})


def test_compress_specialises_on_condition(device):
    """The condition sets the output shape: each distinct value builds (and caches) its own plan."""
    x = _f(3, 4)
    node = h.make_node("Compress", ["x", "c"], ["y"], axis=1)
    model = _model(node, {"x": x, "c": np.ones(4, bool)}, {})
    sess = InferenceSession(model, device=device)
    for cond in ([True, False, True, True], [False, True, False, False], [True, False, True, True]):
        c = np.array(cond)
        np.testing.assert_array_equal(sess.run(None, {"x": x, "c": c})[0], np.compress(c, x, axis=1))
    assert len(sess._plans) == 2


def test_unique_with_axis_unsorted(device):
    x = np.array([[1, 3], [0, 2], [1, 3], [0, 2], [5, 5]], np.float32)
    node = h.make_node("Unique", ["x"], ["y", "i", "inv", "n"], axis=0, sorted=0)
    _check(device, node, {"x": x}, n_out=4)


# ---------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    ("mode", "padding", "align"),
    [("cubic", "reflection", 0), ("cubic", "zeros", 1), ("nearest", "border", 0), ("linear", "reflection", 1)],
)
def test_grid_sample_2d(device, mode, padding, align):
    x, grid = _f(2, 3, 5, 4), _f(2, 3, 6, 2, lo=-1.4, hi=1.4)
    node = h.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    _check(device, node, {"x": x, "g": grid}, opset=20, tol=1e-4)


def test_grid_sample_3d_border(device):
    x, grid = _f(1, 2, 3, 4, 3), _f(1, 2, 3, 2, 3, lo=-1.3, hi=1.3)
    node = h.make_node("GridSample", ["x", "g"], ["y"], mode="linear", padding_mode="border")
    _check(device, node, {"x": x, "g": grid}, opset=20, tol=1e-4)


def test_affine_grid_3d(device):
    node = h.make_node("AffineGrid", ["t", "s"], ["y"], align_corners=0)
    _check(device, node, {"t": _f(2, 3, 4)}, {"s": np.array([2, 1, 3, 4, 5], np.int64)}, opset=20)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_adaptive_sampling(device, mode):
    """sampling_ratio 0: each box takes ceil(size / bins) samples per bin, so boxes of different sizes mix."""
    x = _f(2, 3, 8, 7)
    rois = np.array([[0.5, 1.0, 6.0, 7.5], [1.0, 0.2, 2.5, 2.0], [-1.5, 3.0, 9.0, 5.0]], np.float32)
    node = h.make_node("RoiAlign", ["x", "r", "b"], ["y"], mode=mode, output_height=2, output_width=3, sampling_ratio=0)
    _check(device, node, {"x": x}, {"r": rois, "b": np.array([1, 0, 1], np.int64)}, tol=1e-4)


def test_nms_center_boxes_multi_class(device):
    centres = RNG.uniform(0, 4, (2, 12, 2))
    sizes = RNG.uniform(0.5, 2.0, (2, 12, 2))
    boxes = np.concatenate([centres, sizes], -1).astype(np.float32)
    scores = RNG.uniform(0, 1, (2, 3, 12)).astype(np.float32)
    node = h.make_node("NonMaxSuppression", ["b", "s", "m", "iou", "st"], ["y"], center_point_box=1)
    consts = {
        "m": np.array([4], np.int64),
        "iou": np.array([0.3], np.float32),
        "st": np.array([0.2], np.float32),
    }
    _check(device, node, {"b": boxes, "s": scores}, consts)


def test_col2im_3d_and_max_unpool_output_shape(device):
    x = _f(1, 2 * 8, 12)  # 2 channels, a 2x2x2 block, 1x2x6 sliding positions over a 2x3x7 image
    node = h.make_node("Col2Im", ["x", "img", "blk"], ["y"], strides=[1, 1, 1])
    _check(device, node, {"x": x}, {"img": np.array([2, 3, 7], np.int64), "blk": np.array([2, 2, 2], np.int64)})
    v = _f(1, 1, 2, 2)
    idx = np.array([[[[5, 7], [13, 15]]]], np.int64)
    node = h.make_node("MaxUnpool", ["v", "i", "s"], ["y"], kernel_shape=[2, 2], strides=[2, 2])
    _check(device, node, {"v": v, "i": idx}, {"s": np.array([1, 1, 5, 5], np.int64)})


def test_det_needs_pivoting(device):
    a = np.array(
        [
            [[0.0, 2.0, 1.0, 3.0], [1.0, 0.0, 4.0, 1.0], [2.0, 1.0, 0.0, 5.0], [1.0, 3.0, 2.0, 0.0]],
            [[1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0], [0.0, 1.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]],  # singular
        ],
        np.float32,
    )
    node = h.make_node("Det", ["a"], ["y"])
    _check(device, node, {"a": a}, tol=1e-4)


def test_deform_conv_groups_strides_mask(device):
    x, w = _f(1, 4, 6, 7), _f(6, 2, 2, 3)  # 2 groups; 2 offset groups; a 4x2 output
    offset, mask, bias = _f(1, 2 * 2 * 3 * 2, 4, 2, lo=-1.5, hi=1.5), _f(1, 2 * 2 * 3, 4, 2, lo=0, hi=1), _f(6)
    node = h.make_node(
        "DeformConv",
        ["x", "w", "o", "b", "m"],
        ["y"],
        group=2,
        offset_group=2,
        strides=[2, 2],
        dilations=[1, 2],
        pads=[1, 0, 1, 0],
        kernel_shape=[2, 3],
    )
    _check(device, node, {"x": x, "o": offset, "m": mask}, {"w": w, "b": bias}, opset=22, tol=1e-4)


# ---------------------------------------------------------------- signal


def test_dft_complex_input_other_axis(device):
    x = _f(2, 6, 3, 2)
    node = h.make_node("DFT", ["x", "", "a"], ["y"], inverse=0)
    _check(device, node, {"x": x}, {"a": np.array(1, np.int64)}, opset=20, tol=1e-4)


def test_dft_irfft_odd_length(device):
    x = _f(1, 4, 2)
    node = h.make_node("DFT", ["x", "n", "a"], ["y"], inverse=1, onesided=1)
    feed_consts = {"n": np.array(7, np.int64), "a": np.array(1, np.int64)}
    _check(device, node, {"x": x}, feed_consts, opset=20, tol=1e-4)


def test_stft_with_window_and_step(device):
    x = _f(2, 20, 1)
    win = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(6) / 6)).astype(np.float32)
    node = h.make_node("STFT", ["x", "s", "w"], ["y"], onesided=1)
    _check(device, node, {"x": x}, {"s": np.array(3, np.int64), "w": win}, opset=17, tol=1e-4)


# ---------------------------------------------------------------- transformer blocks


def test_rotary_3d_positions_partial_interleaved(device):
    x = _f(2, 3, 16)  # 2 heads of 8, rotating the first 4 dims of each
    cos, sin = _f(10, 2), _f(10, 2)
    node = h.make_node(
        "RotaryEmbedding", ["x", "c", "s", "p"], ["y"], num_heads=2, rotary_embedding_dim=4, interleaved=1
    )
    _check(device, node, {"x": x, "p": np.array([[0, 4, 9], [3, 3, 1]], np.int64)}, {"c": cos, "s": sin}, opset=23)


def test_linear_attention_gated_delta_gqa_with_state(device):
    b, t, hq, hkv, dk, dv = 2, 3, 4, 2, 3, 2
    feed = {
        "q": _f(b, t, hq * dk),
        "k": _f(b, t, hkv * dk),
        "v": _f(b, t, hkv * dv),
        "s": _f(b, hkv, dk, dv),
        "g": _f(b, t, hkv * dk, lo=-0.5, hi=0.0),  # a decay per key dimension
        "beta": _f(b, t, 1, lo=0.0, hi=1.0),  # one beta for all heads
    }
    node = h.make_node(
        "LinearAttention",
        ["q", "k", "v", "s", "g", "beta"],
        ["y", "state"],
        q_num_heads=hq,
        kv_num_heads=hkv,
        update_rule="gated_delta",
    )
    _check(device, node, feed, n_out=2, opset=28, tol=1e-4)


@pytest.mark.parametrize("mode", ["TFIDF", "IDF"])
def test_tfidf_trigrams_with_skips_and_weights(device, mode):
    x = RNG.integers(0, 5, 14).astype(np.int64)
    node = h.make_node(
        "TfIdfVectorizer",
        ["x"],
        ["y"],
        mode=mode,
        min_gram_length=1,
        max_gram_length=3,
        max_skip_count=2,
        ngram_counts=[0, 3, 7],
        ngram_indexes=[0, 1, 2, 3, 4, 1, 5],  # two n-grams share column 1
        pool_int64s=[1, 2, 4, 1, 2, 3, 3, 0, 2, 1],
        weights=[0.5, 1.5, 2.0, 0.25, 3.0, 1.0],
    )
    _check(device, node, {"x": x})


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("node", "feed", "message"),
    [
        (h.make_node("SwiGLU", ["a", "b"], ["y"]), {"a": np.zeros((2, 3), np.float32)}, "does not broadcast"),
        (h.make_node("Det", ["a"], ["y"]), {"a": np.zeros((2, 3), np.float32)}, r"must be \(\.\.\., n, n\)"),
        (h.make_node("GridSample", ["a", "b"], ["y"], mode="area"), {"a": np.zeros((1, 1, 2, 2), np.float32)}, "mode"),
    ],
)
def test_bad_nodes_raise_plait_errors(device, node, feed, message):
    other = {"b": np.zeros((1, 2, 2, 2) if node.op_type == "GridSample" else (3, 2), np.float32)}
    model = _model(node, {**feed, **other}, {}, opset=28)
    with pytest.raises(PlaitError, match=message):
        InferenceSession(model, device=device).run(None, {**feed, **other})


def test_topk_k_out_of_range(device):
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], name="tk")
    model = _model(node, {"x": np.zeros((2, 3), np.float32)}, {"k": np.array([4], np.int64)}, n_out=2)
    with pytest.raises(OnnxModelError, match=r"'tk'.*K=4 is outside \[0, 3\]"):
        InferenceSession(model, device=device).run(None, {"x": np.zeros((2, 3), np.float32)})
