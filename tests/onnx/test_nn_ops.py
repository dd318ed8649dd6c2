"""ONNX pooling, normalization, Einsum and Resize (plait/onnx/ops/nn.py, resize.py) against onnx's
ReferenceEvaluator, on every device: what the node tests leave out (MaxPool Indices with storage_order=1 and
batches, BatchNormalization training outputs, Einsum ellipses and diagonals, Resize on 3 axes
with cubic antialiasing and crops) and the errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from plait.errors import PlaitError
from plait.onnx import InferenceSession


def _model(node: onnx.NodeProto, feed: dict[str, np.ndarray], outs: list[np.ndarray], opset: int) -> bytes:
    inputs = [h.make_tensor_value_info(k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feed.items()]
    outputs = [
        h.make_tensor_value_info(o, h.np_dtype_to_tensor_dtype(w.dtype), w.shape)
        for o, w in zip(node.output, outs, strict=True)
    ]
    graph = h.make_graph([node], "g", inputs, outputs)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=10).SerializeToString()


def _check(device: str, node: onnx.NodeProto, feed: dict[str, np.ndarray], opset: int = 21, tol: float = 1e-5) -> None:
    probe = h.make_model(
        h.make_graph(
            [node],
            "g",
            [h.make_tensor_value_info(k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feed.items()],
            [h.make_empty_tensor_value_info(o) for o in node.output],
        ),
        opset_imports=[h.make_opsetid("", opset)],
        ir_version=10,
    )
    want = ReferenceEvaluator(probe).run(None, feed)
    got = InferenceSession(_model(node, feed, want, opset), device=device).run(None, feed)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices(device: str, storage_order: int) -> None:
    node = h.make_node(
        "MaxPool",
        ["x"],
        ["y", "i"],
        kernel_shape=[3, 2],
        strides=[2, 1],
        pads=[1, 0, 1, 1],
        storage_order=storage_order,
    )
    _check(device, node, {"x": _rand(2, 3, 7, 5)}, opset=12)


def test_maxpool_3d_large_window(device: str) -> None:
    node = h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[4, 3, 5], strides=[2, 2, 3], dilations=[1, 2, 1])
    _check(device, node, {"x": _rand(1, 2, 11, 12, 16)})


@pytest.mark.parametrize("opset", [14, 15])
def test_batchnorm_training_outputs(device: str, opset: int) -> None:
    c = 4
    feed = {
        "x": _rand(3, c, 5, 2),
        "s": _rand(c, seed=1),
        "b": _rand(c, seed=2),
        "m": _rand(c, seed=3),
        "v": np.abs(_rand(c, seed=4)) + 0.5,
    }
    outs = ["y", "rm", "rv"] if opset >= 14 else ["y", "rm", "rv", "sm", "sv"]
    attrs: dict[str, Any] = {"momentum": 0.8, "epsilon": 1e-3}
    if opset >= 14:
        attrs["training_mode"] = 1
    node = h.make_node("BatchNormalization", list(feed), outs, **attrs)
    _check(device, node, feed, opset=opset, tol=1e-4)


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [("...ii->...i", [(2, 3, 4, 4)]), ("bii->b", [(2, 3, 3)]), ("i...j,j...k->...ik", [(2, 3, 4), (4, 3, 5)])],
)
def test_einsum_ellipsis_and_diagonals(device: str, equation: str, shapes: list[tuple[int, ...]]) -> None:
    feed = {f"x{i}": _rand(*s, seed=i) for i, s in enumerate(shapes)}
    _check(device, h.make_node("Einsum", list(feed), ["y"], equation=equation), feed, tol=1e-4)


def test_einsum_operand_count_mismatch_is_an_error() -> None:
    feed = {"x0": _rand(2, 2)}
    node = h.make_node("Einsum", ["x0"], ["y"], equation="ij,jk->ik")
    model = _model(node, feed, [np.zeros((2, 2), np.float32)], 21)
    with pytest.raises(PlaitError, match="Einsum equation 'ij,jk->ik' names 2 operands"):
        InferenceSession(model, device="cpu").run(None, feed)


@pytest.mark.parametrize(
    "attrs",
    [
        {"mode": "cubic", "antialias": 1, "cubic_coeff_a": -0.5},
        {"mode": "cubic", "exclude_outside": 1, "coordinate_transformation_mode": "align_corners"},
        {"mode": "linear", "antialias": 1, "coordinate_transformation_mode": "half_pixel_symmetric"},
        {"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "asymmetric"},
    ],
)
def test_resize_three_axes(device: str, attrs: dict[str, Any]) -> None:
    feed = {"x": _rand(1, 2, 5, 9, 6), "scales": np.array([1.0, 1.0, 0.6, 1.7, 0.5], np.float32)}
    node = h.make_node("Resize", ["x", "", "scales"], ["y"], **attrs)
    _check(device, node, feed, opset=19, tol=1e-4)


def test_resize_crop_with_axes_and_sizes(device: str) -> None:
    feed = {
        "x": _rand(2, 3, 8, 8),
        "roi": np.array([0.1, 0.2, 0.9, 1.2], np.float32),
        "sizes": np.array([5, 7], np.int64),
    }
    node = h.make_node(
        "Resize",
        ["x", "roi", "", "sizes"],
        ["y"],
        mode="linear",
        axes=[3, 2],
        coordinate_transformation_mode="tf_crop_and_resize",
        extrapolation_value=-3.0,
    )
    _check(device, node, feed, opset=19, tol=1e-4)


def test_resize_unknown_mode_is_an_error() -> None:
    feed = {"x": _rand(1, 1, 2, 2), "scales": np.array([1, 1, 2, 2], np.float32)}
    node = h.make_node("Resize", ["x", "", "scales"], ["y"], mode="lanczos")
    model = _model(node, feed, [np.zeros((1, 1, 4, 4), np.float32)], 19)
    with pytest.raises(PlaitError, match="Resize mode 'lanczos'"):
        InferenceSession(model, device="cpu").run(None, feed)
