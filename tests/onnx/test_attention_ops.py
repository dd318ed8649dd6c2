"""ONNX Attention and BitShift (plait/onnx/ops/attention.py) against onnx's ReferenceEvaluator and NumPy, on every
device: causal masks with a KV cache, sliding windows on both sides, an external cache (nonpad_kv_seqlen) with a
bool mask, softcap before the mask, the qk_matmul_output modes, ai.onnx.preview FlexAttention with its score_mod and
prob_mod subgraphs, and right shifts over the whole int32/int64 range.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from plait.onnx import InferenceSession


def _run_both(device: str, node: Any, feed: dict[str, np.ndarray], n_out: int = 1) -> None:
    names = [n for n in node.input if n]
    inputs = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(feed[n].dtype), feed[n].shape) for n in names]

    def model(outs: list[np.ndarray] | None) -> Any:
        outputs = [
            h.make_tensor_value_info(o, h.np_dtype_to_tensor_dtype(w.dtype), w.shape)
            if outs is not None
            else h.make_empty_tensor_value_info(o)
            for o, w in zip(node.output[:n_out], outs or [None] * n_out, strict=True)
        ]
        graph = h.make_graph([node], "g", inputs, outputs)
        return h.make_model(graph, opset_imports=[h.make_opsetid("", 25)], ir_version=11)

    want = ReferenceEvaluator(model(None)).run(None, feed)
    got = InferenceSession(model(want).SerializeToString(), device=device).run(None, feed)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _rand(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "attrs",
    [
        {"is_causal": 1, "left_window_size": 1},
        {"left_window_size": 2, "right_window_size": 0, "softcap": 1.5, "qk_matmul_output_mode": 2},
        {"is_causal": 1, "qk_matmul_output_mode": 3},
    ],
)
def test_attention_with_cache_and_windows(device: str, attrs: dict[str, Any]) -> None:
    feed = {
        "q": _rand(2, 4, 3, 8, seed=0),
        "k": _rand(2, 2, 3, 8, seed=1),
        "v": _rand(2, 2, 3, 6, seed=2),
        "mask": np.random.default_rng(3).random((3, 5)) > 0.2,
        "pk": _rand(2, 2, 2, 8, seed=4),
        "pv": _rand(2, 2, 2, 6, seed=5),
    }
    node = h.make_node("Attention", ["q", "k", "v", "mask", "pk", "pv"], ["y", "ck", "cv", "qk"], **attrs)
    _run_both(device, node, feed, n_out=4)


def test_attention_external_cache_lengths(device: str) -> None:
    feed = {
        "q": _rand(3, 2, 2, 4, seed=0),
        "k": _rand(3, 2, 6, 4, seed=1),
        "v": _rand(3, 2, 6, 4, seed=2),
        "mask": np.random.default_rng(3).random((2, 6)) > 0.1,
        "lengths": np.array([6, 3, 1], np.int64),
    }
    node = h.make_node("Attention", ["q", "k", "v", "mask", "", "", "lengths"], ["y"], is_causal=1, left_window_size=2)
    _run_both(device, node, feed)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_bitshift_right_is_exact(device: str, dtype: type) -> None:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    bits = 8 * np.dtype(dtype).itemsize
    x = np.concatenate([[info.min, info.max, -1, 0, 1], rng.integers(info.min, info.max, 300)]).astype(dtype)
    y = rng.integers(-3, bits + 3, x.size).astype(dtype)
    node = h.make_node("BitShift", ["x", "y"], ["z"], direction="RIGHT")
    vi = [h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(np.dtype(dtype)), [x.size]) for n in "xyz"]
    model = h.make_model(h.make_graph([node], "g", vi[:2], vi[2:]), opset_imports=[h.make_opsetid("", 21)])
    got = InferenceSession(model.SerializeToString(), device=device).run(None, {"x": x, "y": y})[0]
    # shifts below 0 or past the sign bit leave only the sign, as the node tests expect
    np.testing.assert_array_equal(got, x >> np.where((y < 0) | (y >= bits), bits - 1, y))


def test_flex_attention_with_score_and_prob_mods(device: str) -> None:
    """ai.onnx.preview FlexAttention with grouped-query heads, a causal score_mod and a prob_mod."""
    f = h.make_tensor_value_info
    rows = h.make_node("Shape", ["scores"], ["shape"])
    score_mod = h.make_graph(
        [
            rows,
            h.make_node("Gather", ["shape", "i2"], ["n_q"]),
            h.make_node("Gather", ["shape", "i3"], ["n_k"]),
            h.make_node("Range", ["zero", "n_q", "one"], ["qr"]),
            h.make_node("Range", ["zero", "n_k", "one"], ["kr"]),
            h.make_node("Unsqueeze", ["qr", "ax"], ["qi"]),
            h.make_node("GreaterOrEqual", ["qi", "kr"], ["keep"]),
            h.make_node("Where", ["keep", "scores", "low"], ["out"]),
        ],
        "score_mod",
        [f("scores", 1, None)],
        [f("out", 1, None)],
        initializer=[
            h.make_tensor("i2", 7, [], [2]),
            h.make_tensor("i3", 7, [], [3]),
            h.make_tensor("zero", 7, [], [0]),
            h.make_tensor("one", 7, [], [1]),
            h.make_tensor("ax", 7, [1], [1]),
            h.make_tensor("low", 1, [], [-1e9]),
        ],
    )
    prob_mod = h.make_graph(
        [h.make_node("Mul", ["probs", "half"], ["out"])],
        "prob_mod",
        [f("probs", 1, None)],
        [f("out", 1, None)],
        initializer=[h.make_tensor("half", 1, [], [0.5])],
    )
    node = h.make_node(
        "FlexAttention",
        ["q", "k", "v"],
        ["y"],
        domain="ai.onnx.preview",
        score_mod=score_mod,
        prob_mod=prob_mod,
        scale=0.3,
    )
    feed = {"q": _rand(2, 4, 5, 8, seed=0), "k": _rand(2, 2, 5, 8, seed=1), "v": _rand(2, 2, 5, 3, seed=2)}
    inputs = [f(n, 1, a.shape) for n, a in feed.items()]
    opsets = [h.make_opsetid("", 26), h.make_opsetid("ai.onnx.preview", 1)]
    probe = h.make_model(h.make_graph([node], "g", inputs, [f("y", 1, None)]), opset_imports=opsets, ir_version=11)
    want = ReferenceEvaluator(probe).run(None, feed)[0]
    model = h.make_model(
        h.make_graph([node], "g", inputs, [f("y", 1, want.shape)]), opset_imports=opsets, ir_version=11
    )
    got = InferenceSession(model.SerializeToString(), device=device).run(None, feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
