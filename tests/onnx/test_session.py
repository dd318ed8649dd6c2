"""InferenceSession: ORT's surface, symbolic batch, external data, and every bad-input error."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import plait
from plait.onnx import InferenceSession


def _mlp(batch: int | str = "N", opset: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
        helper.make_node("Add", ["h", "b1"], ["hb"], name="add1"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w2"], ["logits"], name="mm2"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4])],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 3]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3]),
        ],
        [w1, b1, w2],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _numpy_mlp(model: onnx.ModelProto, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    logits = np.maximum(x @ w["w1"] + w["b1"], 0) @ w["w2"]
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return logits, e / e.sum(-1, keepdims=True)


def test_run_matches_numpy_and_ort_surface(device: str) -> None:
    model = _mlp()
    sess = InferenceSession(model.SerializeToString(), device=device)
    assert [(i.name, i.shape, i.type) for i in sess.get_inputs()] == [("x", ["N", 4], "tensor(float)")]
    assert [o.name for o in sess.get_outputs()] == ["logits", "probs"]
    for batch in (1, 5, 1):  # symbolic batch: a plan per shape, cached
        x = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        logits, probs = sess.run(None, {"x": x})
        want_l, want_p = _numpy_mlp(model, x)
        np.testing.assert_allclose(logits, want_l, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(probs, want_p, rtol=1e-4, atol=1e-6)
        (only,) = sess.run(["probs"], {"x": x})
        np.testing.assert_allclose(only, want_p, rtol=1e-4, atol=1e-6)
    assert len(sess._plans) == 2


def test_path_and_external_data(tmp_path: object, device: str) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    model = _mlp()
    x = np.ones((2, 4), np.float32)
    want = _numpy_mlp(model, x)[1]
    onnx.save_model(
        model,
        d / "m.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    got = InferenceSession(str(d / "m.onnx"), device=device).run(None, {"x": x})
    np.testing.assert_allclose(got[1], want, rtol=1e-4, atol=1e-6)


def test_external_data_outside_folder_is_refused(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    (d / "sub").mkdir()
    (d / "secret.bin").write_bytes(np.zeros(100, np.float32).tobytes())
    model = _mlp()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "../secret.bin"), ("offset", "0"), ("length", "128")):
        w.external_data.add(key=k, value=v)
    (d / "sub" / "m.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(plait.PlaitError, match="outside the model's folder"):
        InferenceSession(str(d / "sub" / "m.onnx"), device="cpu")


def test_truncated_and_malformed_files(tmp_path: object) -> None:
    from pathlib import Path

    data = _mlp().SerializeToString()
    with pytest.raises(plait.PlaitError, match=r"truncated|malformed|parse"):
        InferenceSession(data[: len(data) // 2], device="cpu")
    with pytest.raises(plait.PlaitError, match="empty"):
        InferenceSession(b"", device="cpu")
    with pytest.raises(plait.PlaitError):
        InferenceSession(b"\x08\x07garbage\xff\xff\xff", device="cpu")
    with pytest.raises(plait.PlaitError, match="does not exist"):
        InferenceSession(str(Path(str(tmp_path)) / "missing.onnx"), device="cpu")


def test_unknown_operator_and_opset() -> None:
    g = helper.make_graph(
        [helper.make_node("FancyOp", ["x"], ["y"], name="fancy", domain="com.example")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(plait.PlaitError, match="fancy"):
        InferenceSession(m.SerializeToString(), device="cpu")
    g2 = helper.make_graph(
        [helper.make_node("ImageDecoder", ["x"], ["y"], name="decode")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [64])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [8, 8, 3])],
    )
    with pytest.raises(plait.UnsupportedError, match=r"decode.*ImageDecoder"):
        InferenceSession(helper.make_model(g2, opset_imports=[helper.make_opsetid("", 20)]), device="cpu")
    with pytest.raises(plait.UnsupportedError, match="opset 5"):
        InferenceSession(_mlp(opset=5).SerializeToString(), device="cpu")


def test_repeated_calls_take_the_short_path_and_keep_every_check(device: str) -> None:
    """A call repeating the last one's feed signature and output names skips the full feed check (_repeatable):
    its results still match NumPy, are fresh arrays each call, and any other feed still gets the full check."""
    model = _mlp()
    sess = InferenceSession(model.SerializeToString(), device=device)
    rng = np.random.default_rng(3)
    first = None
    for _ in range(3):
        x = rng.standard_normal((2, 4)).astype(np.float32)
        logits, probs = sess.run(None, {"x": x})
        assert sess._repeat is not None
        want_l, want_p = _numpy_mlp(model, x)
        np.testing.assert_allclose(logits, want_l, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(probs, want_p, rtol=1e-4, atol=1e-6)
        if first is not None:
            assert logits is not first
        first = logits
        logits[:] = 7.0  # the caller owns its results: the next call must not see this
    x = rng.standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(sess.run(["probs"], {"x": x})[0], _numpy_mlp(model, x)[1], rtol=1e-4, atol=1e-6)
    # a non-contiguous feed of the same signature
    wide = rng.standard_normal((6, 8)).astype(np.float32)
    np.testing.assert_allclose(
        sess.run(["probs"], {"x": wide[:, ::2]})[0], _numpy_mlp(model, wide[:, ::2])[1], rtol=1e-4, atol=1e-6
    )
    # the same output twice: two arrays, equal and distinct
    a, b = sess.run(["probs", "probs"], {"x": x})
    assert a is not b and np.array_equal(a, b)
    with pytest.raises(plait.PlaitError, match="'x' has dtype float64"):
        sess.run(["probs"], {"x": x.astype(np.float64)})
    with pytest.raises(plait.PlaitError, match="'y' is not an input"):
        sess.run(["probs"], {"y": x})
    with pytest.raises(plait.PlaitError, match="'nope' is not an output"):
        sess.run(["nope"], {"x": x})


def test_plan_call_copies_through_host_views() -> None:
    """Plan.__call__ on the cpu copies inputs and outputs through host views of its buffers: casts, non-contiguous
    inputs and fresh outputs behave as copy_in and copy_out did."""
    from plait.frontends.native.jit import jit
    from plait.frontends.native.tensor import Tensor

    @jit(device="cpu")
    def f(x: Tensor) -> Tensor:
        return (x * 2.0 + 1.0).relu()

    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 6)).astype(np.float32)
    y1 = np.asarray(f(x))
    np.testing.assert_allclose(y1, np.maximum(x * 2 + 1, 0), rtol=1e-6)
    plan = f.plan_for([x])[0]
    ins, outs = plan._host_io()
    assert ins[0] is not None and outs[0][1] is not None
    y2 = np.asarray(f(x.T.copy().T))  # a non-contiguous view of the same values
    np.testing.assert_array_equal(y1, y2)
    assert y1 is not y2
    y1[:] = -1.0
    np.testing.assert_array_equal(np.asarray(f(x)), y2)


def test_bad_feeds_name_the_input() -> None:
    sess = InferenceSession(_mlp(batch=2).SerializeToString(), device="cpu")
    good = np.ones((2, 4), np.float32)
    with pytest.raises(plait.PlaitError, match="'y' is not an input"):
        sess.run(None, {"x": good, "y": good})
    with pytest.raises(plait.PlaitError, match="'x' is missing"):
        sess.run(None, {})
    with pytest.raises(plait.PlaitError, match="'x' has dtype float64"):
        sess.run(None, {"x": good.astype(np.float64)})
    with pytest.raises(plait.PlaitError, match="'x' has shape \\(3, 4\\)"):
        sess.run(None, {"x": np.ones((3, 4), np.float32)})
    with pytest.raises(plait.PlaitError, match="rank"):
        sess.run(None, {"x": np.ones((2, 4, 1), np.float32)})
    with pytest.raises(plait.PlaitError, match="'nope' is not an output"):
        sess.run(["nope"], {"x": good})


def test_shape_subgraph_is_folded_on_host(device: str) -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: folded with NumPy, one reshape on the device."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Constant", [], ["i0"], value=numpy_helper.from_array(np.array(0, np.int64))),
        helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
        helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
        helper.make_node("Constant", [], ["m1"], value=numpy_helper.from_array(np.array([-1], np.int64))),
        helper.make_node("Concat", ["n1", "m1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 12])],
    )
    sess = InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), device=device)
    for n in (2, 3):
        x = np.arange(n * 12, dtype=np.float32).reshape(n, 3, 4)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x.reshape(n, 12))


def test_value_dependent_input_specialises_the_plan(device: str) -> None:
    """A Reshape whose target shape is a graph input: the plan is specialised on that input's contents."""
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
    )
    sess = InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), device=device)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ([3, 4], [4, 3], [3, 4]):
        np.testing.assert_array_equal(sess.run(None, {"x": x, "shape": np.array(shape)})[0], x.reshape(shape))


def test_outputs_are_the_callers_own_arrays(device: str) -> None:
    """Each run's outputs are new arrays the caller owns: the plan's results are handed over without a second copy,
    but an output named twice (an Identity of another output) and an input passed straight through are copies, so
    writing into one leaves the others, the feed and the next run alone."""
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Identity", ["y"], ["y2"]),
        helper.make_node("Identity", ["x"], ["x2"]),
    ]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("y", "y2", "x2")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])], info)
    sess = InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), device=device)
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    y, y2, x2 = sess.run(None, {"x": x})
    want = np.maximum(x, 0)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(y2, want)
    np.testing.assert_array_equal(x2, x)
    y[...] = 7.0
    x2[...] = 9.0
    np.testing.assert_array_equal(y2, want)
    np.testing.assert_array_equal(x, np.arange(-3, 3, dtype=np.float32).reshape(2, 3))
    again = sess.run(["y"], {"x": x})[0]
    assert again is not y
    np.testing.assert_array_equal(again, want)
