"""ONNX control flow, sequences and optionals (plait/onnx/ops/control.py) against onnx's ReferenceEvaluator.

Covers what the node tests do not: If on a condition computed from input data (both branches, selected with
where), Loop with a data-dependent condition (masked unrolling), Scan with reversed directions and other axes,
the sequence ops' positions and axes, sequences fed to and returned by a session, and the errors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.backend.test.loader import load_node_model_tests
from onnx.reference import ReferenceEvaluator

from plait.cli import main
from plait.errors import PlaitError
from plait.onnx import InferenceSession
from plait.onnx.errors import OnnxModelError, OnnxUnsupportedError
from plait.onnx.ops import control
from tests.onnx.conftest import ort_run

F = T.FLOAT


def _model(nodes: list[onnx.NodeProto], inputs: list[Any], outputs: list[Any], opset: int = 18) -> bytes:
    g = h.make_graph(nodes, "g", inputs, outputs)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _same(got: Any, want: Any) -> None:
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _same(g, w)
        return
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _check(model: bytes, feed: dict[str, Any], device: str, ort: bool = False) -> InferenceSession:
    """Compare plait with onnx's ReferenceEvaluator, or with ONNX Runtime where the evaluator is wrong (it runs no
    iteration of a Loop whose condition input is absent)."""
    sess = InferenceSession(model, device=device)
    want = ort_run(model, feed) if ort else ReferenceEvaluator(model).run(None, feed)
    got = sess.run(None, feed)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    return sess


def _vi(name: str, elem: int, shape: Any) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, elem, shape)


def _seq_vi(name: str, elem: int, shape: Any = None) -> onnx.ValueInfoProto:
    return h.make_tensor_sequence_value_info(name, elem, shape)


# ---------------------------------------------------------------- If


def _branch(name: str, op: str, out: str, shape: list[int]) -> onnx.GraphProto:
    return h.make_graph([h.make_node(op, ["x"], [out])], name, [], [_vi(out, F, shape)])


def _data_if(then_op: str = "Relu", else_op: str = "Neg", shape: tuple[int, ...] = (4, 32)) -> bytes:
    """If(ReduceSum(x) > 0): a condition computed from 128 input elements, over SPECIALISE_MAX."""
    nodes = [
        h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        h.make_node("Constant", [], ["zero"], value=h.make_tensor("z", F, [], [0.0])),
        h.make_node("Greater", ["s", "zero"], ["c"]),
        h.make_node(
            "If",
            ["c"],
            ["y"],
            then_branch=_branch("then", then_op, "a", list(shape)),
            else_branch=_branch("else", else_op, "b", list(shape)),
        ),
    ]
    return _model(nodes, [_vi("x", F, list(shape))], [_vi("y", F, list(shape))])


def test_if_on_data_selects_between_both_branches(device: str) -> None:
    model = _data_if()
    rng = np.random.default_rng(0)
    sess = _check(model, {"x": rng.standard_normal((4, 32)).astype(np.float32) + 1.0}, device)
    # the same plan serves the other branch: no specialisation on the data
    x = rng.standard_normal((4, 32)).astype(np.float32) - 1.0
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], -x)
    assert len(sess._plans) == 1


def test_if_on_data_with_branches_of_different_shapes_is_refused() -> None:
    nodes = [
        h.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        h.make_node("Constant", [], ["zero"], value=h.make_tensor("z", F, [], [0.0])),
        h.make_node("Greater", ["s", "zero"], ["c"]),
        h.make_node(
            "If",
            ["c"],
            ["y"],
            name="pick",
            then_branch=_branch("then", "Relu", "a", [4, 32]),
            else_branch=h.make_graph(
                [h.make_node("ReduceSum", ["x"], ["b"], keepdims=0)], "else", [], [_vi("b", F, [])]
            ),
        ),
    ]
    model = _model(nodes, [_vi("x", F, [4, 32])], [_vi("y", F, [4, 32])])
    with pytest.raises(OnnxUnsupportedError, match=r"node 'pick' \(If\).*same shape"):
        InferenceSession(model, device="cpu").run(None, {"x": np.ones((4, 32), np.float32)})


def test_if_on_a_flag_input_specialises_the_plan(device: str) -> None:
    nodes = [
        h.make_node(
            "If",
            ["c"],
            ["y"],
            then_branch=_branch("then", "Relu", "a", [3]),
            else_branch=h.make_graph([h.make_node("ReduceSum", ["x"], ["b"])], "else", [], [_vi("b", F, [1])]),
        )
    ]
    model = _model(nodes, [_vi("c", T.BOOL, []), _vi("x", F, [3])], [_vi("y", F, ["n"])])
    x = np.array([-1.0, 2.0, 3.0], np.float32)
    sess = _check(model, {"c": np.array(True), "x": x}, device)
    _check(model, {"c": np.array(False), "x": x}, device)
    # branches of different shapes are fine here: each value of the flag gets its own plan
    np.testing.assert_allclose(sess.run(None, {"c": np.array(False), "x": x})[0], [4.0])
    assert len(sess._plans) == 2


# ---------------------------------------------------------------- Loop


def _loop_body(cond_from_data: bool) -> onnx.GraphProto:
    """acc = acc * 0.5 + x; with cond_from_data the loop goes on while sum(acc) < 100."""
    nodes = [
        h.make_node("Constant", [], ["half"], value=h.make_tensor("h", F, [], [0.5])),
        h.make_node("Mul", ["acc_in", "half"], ["scaled"]),
        h.make_node("Add", ["scaled", "x"], ["acc_out"]),
    ]
    if cond_from_data:
        nodes += [
            h.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
            h.make_node("Constant", [], ["limit"], value=h.make_tensor("l", F, [], [100.0])),
            h.make_node("Less", ["total", "limit"], ["cond_out"]),
        ]
    else:
        nodes.append(h.make_node("Identity", ["cond_in"], ["cond_out"]))
    return h.make_graph(
        nodes,
        "body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("acc_in", F, [8, 16])],
        [_vi("cond_out", T.BOOL, []), _vi("acc_out", F, [8, 16])],
    )


def _loop_model(trip: int | None, cond_from_data: bool, name: str = "loop") -> bytes:
    nodes = [
        h.make_node(
            "Loop", ["M" if trip is not None else "", "", "acc0"], ["acc"], body=_loop_body(cond_from_data), name=name
        )
    ]
    inits = [h.make_tensor("M", T.INT64, [], [trip])] if trip is not None else []
    g = h.make_graph(nodes, "g", [_vi("acc0", F, [8, 16]), _vi("x", F, [8, 16])], [_vi("acc", F, [8, 16])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(m)
    return m.SerializeToString()


def test_loop_with_trip_count_unrolls(device: str) -> None:
    rng = np.random.default_rng(1)
    feed = {
        "acc0": rng.standard_normal((8, 16)).astype(np.float32),
        "x": rng.standard_normal((8, 16)).astype(np.float32),
    }
    _check(_loop_model(5, cond_from_data=False), feed, device, ort=True)


def test_loop_with_data_dependent_condition_masks_its_updates(device: str) -> None:
    """The condition depends on 256 input elements: the loop unrolls to its trip count and keeps each update only
    while the device-side condition holds, so one plan gives the reference's early exit for any data (after 1
    or 2 iterations here, or all 12)."""
    model = _loop_model(12, cond_from_data=True)
    rng = np.random.default_rng(2)
    x = rng.random((8, 16)).astype(np.float32)
    x *= 1.0 / x.mean()  # sum(x) = 128, so sum(acc) = 128 * scale * (2 - 2^(1-k)) after k iterations
    for scale in (2.0, 0.65, 0.3):
        sess = _check(model, {"acc0": np.zeros((8, 16), np.float32), "x": scale * x}, device, ort=True)
        sess.run(None, {"acc0": np.zeros((8, 16), np.float32), "x": x})
        assert len(sess._plans) == 1


def test_loop_with_data_dependent_condition_and_no_trip_count_is_refused() -> None:
    feed = {"acc0": np.zeros((8, 16), np.float32), "x": np.ones((8, 16), np.float32)}
    with pytest.raises(OnnxUnsupportedError, match=r"node 'spin' \(Loop\).*no trip count"):
        InferenceSession(_loop_model(None, cond_from_data=True, name="spin"), device="cpu").run(None, feed)


def test_loop_unrolling_is_bounded() -> None:
    feed = {"acc0": np.zeros((8, 16), np.float32), "x": np.ones((8, 16), np.float32)}
    model = _loop_model(control.MAX_STEPS + 1, cond_from_data=False, name="long")
    with pytest.raises(OnnxUnsupportedError, match=rf"node 'long' \(Loop\).*at most {control.MAX_STEPS}"):
        InferenceSession(model, device="cpu").run(None, feed)
    # a data-dependent condition with a huge trip count (an exporter's "while" idiom) is refused before unrolling
    model = _loop_model(2**62, cond_from_data=True, name="while")
    with pytest.raises(OnnxUnsupportedError, match=rf"node 'while' \(Loop\).*{2**62} iterations"):
        InferenceSession(model, device="cpu").run(None, feed)


def test_loop_condition_and_scan_outputs_from_graph_inputs(device: str) -> None:
    """Trip count and condition are graph inputs (specialised); the body stops the loop itself when i == 3 and
    collects a scan output; an outer value is read inside the body."""
    body = h.make_graph(
        [
            h.make_node("Constant", [], ["three"], value=h.make_tensor("t", T.INT64, [], [3])),
            h.make_node("Less", ["i", "three"], ["cond_out"]),
            h.make_node("Cast", ["i"], ["fi"], to=F),
            h.make_node("Mul", ["w", "fi"], ["step"]),
            h.make_node("Add", ["s_in", "step"], ["s_out"]),
            h.make_node("Identity", ["s_out"], ["trace"]),
        ],
        "body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, []), _vi("s_in", F, [2])],
        [_vi("cond_out", T.BOOL, []), _vi("s_out", F, [2]), _vi("trace", F, [2])],
    )
    nodes = [h.make_node("Loop", ["M", "c", "s0"], ["s", "trace_all"], body=body)]
    model = _model(
        nodes,
        [_vi("M", T.INT64, []), _vi("c", T.BOOL, []), _vi("s0", F, [2]), _vi("w", F, [2])],
        [_vi("s", F, [2]), _vi("trace_all", F, ["n", 2])],
    )
    base = {"s0": np.array([1.0, -1.0], np.float32), "w": np.array([0.5, 2.0], np.float32)}
    _check(model, {"M": np.array(10, np.int64), "c": np.array(True), **base}, device)
    _check(model, {"M": np.array(2, np.int64), "c": np.array(True), **base}, device)


def test_loop_with_zero_iterations_gives_empty_scan_outputs() -> None:
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Cast", ["i"], ["out"], to=F)],
        "body",
        [_vi("i", T.INT64, []), _vi("cond_in", T.BOOL, [])],
        [_vi("cond_out", T.BOOL, []), _vi("out", F, [])],
    )
    model = _model([h.make_node("Loop", ["M", ""], ["ys"], body=body)], [_vi("M", T.INT64, [])], [_vi("ys", F, ["n"])])
    _check(model, {"M": np.array(0, np.int64)}, "cpu", ort=True)
    _check(model, {"M": np.array(4, np.int64)}, "cpu", ort=True)


# ---------------------------------------------------------------- Scan


def test_scan_with_reversed_directions_and_axes(device: str) -> None:
    body = h.make_graph(
        [
            h.make_node("Add", ["s_in", "a"], ["s_out"]),
            h.make_node("Mul", ["s_out", "b"], ["p"]),
            h.make_node("Add", ["p", "offset"], ["y"]),
        ],
        "body",
        [_vi("s_in", F, [3]), _vi("a", F, [3]), _vi("b", F, [3])],
        [_vi("s_out", F, [3]), _vi("y", F, [3])],
        [h.make_tensor("offset", F, [3], [0.5, -1.0, 2.0])],  # an initializer of the body itself
    )
    node = h.make_node(
        "Scan",
        ["s0", "xa", "xb"],
        ["s", "ys"],
        body=body,
        num_scan_inputs=2,
        scan_input_axes=[0, 1],
        scan_input_directions=[1, 0],
        scan_output_axes=[-1],
        scan_output_directions=[1],
    )
    model = _model(
        [node],
        [_vi("s0", F, [3]), _vi("xa", F, [5, 3]), _vi("xb", F, [3, 5])],
        [_vi("s", F, [3]), _vi("ys", F, [3, 5])],
    )
    rng = np.random.default_rng(3)
    feed = {k: rng.standard_normal(s).astype(np.float32) for k, s in (("s0", (3,)), ("xa", (5, 3)), ("xb", (3, 5)))}
    _check(model, feed, device, ort=True)  # the evaluator reverses no scan output


# ---------------------------------------------------------------- sequences and optionals


def test_sequence_ops_positions_and_axes(device: str) -> None:
    nodes = [
        h.make_node("SplitToSequence", ["x"], ["parts"], axis=1),  # 4 slices of shape (2, 1, 3)
        h.make_node("Constant", [], ["p"], value=h.make_tensor("p", T.INT64, [], [-3])),
        h.make_node("SequenceErase", ["parts", "p"], ["erased"]),  # drops slice 1
        h.make_node("Constant", [], ["q"], value=h.make_tensor("q", T.INT64, [], [1])),
        h.make_node("SequenceInsert", ["erased", "y", "q"], ["inserted"]),
        h.make_node("ConcatFromSequence", ["inserted"], ["cat"], axis=1),
        h.make_node("ConcatFromSequence", ["inserted"], ["stacked"], axis=-1, new_axis=1),
        h.make_node("SequenceAt", ["inserted", "p"], ["at"]),
        h.make_node("SequenceLength", ["inserted"], ["n"]),
        h.make_node("SplitToSequence", ["x"], ["chunks"], axis=2, keepdims=0),
        h.make_node("Constant", [], ["two"], value=h.make_tensor("two", T.INT64, [], [2])),
        h.make_node("SplitToSequence", ["x", "two"], ["pairs"], axis=1),
    ]
    outs = [_vi("cat", F, [2, 4, 3]), _vi("stacked", F, [2, 1, 3, 4]), _vi("at", F, [2, 1, 3]), _vi("n", T.INT64, [])]
    outs += [_seq_vi("chunks", F, [2, 4]), _seq_vi("pairs", F, [2, 2, 3])]
    model = _model(nodes, [_vi("x", F, [2, 4, 3]), _vi("y", F, [2, 1, 3])], outs)
    rng = np.random.default_rng(4)
    _check(
        model,
        {
            "x": rng.standard_normal((2, 4, 3)).astype(np.float32),
            "y": rng.standard_normal((2, 1, 3)).astype(np.float32),
        },
        device,
    )


def test_sequence_inputs_outputs_and_sequence_map(device: str) -> None:
    body = h.make_graph(
        [h.make_node("Add", ["a", "b"], ["c"]), h.make_node("Shape", ["a"], ["s"])],
        "body",
        [_vi("a", F, ["n", 3]), _vi("b", F, [3])],
        [_vi("c", F, ["n", 3]), _vi("s", T.INT64, [2])],
    )
    nodes = [h.make_node("SequenceMap", ["xs", "bias"], ["ys", "shapes"], body=body)]
    model = _model(
        nodes,
        [_seq_vi("xs", F, ["n", 3]), _vi("bias", F, [3])],
        [_seq_vi("ys", F, ["n", 3]), _seq_vi("shapes", T.INT64, [2])],
    )
    xs = [np.arange(3, dtype=np.float32).reshape(1, 3), np.ones((2, 3), np.float32)]
    sess = _check(model, {"xs": xs, "bias": np.array([1.0, 2.0, 3.0], np.float32)}, device)
    assert [i.type for i in sess.get_inputs()] == ["seq(tensor(float))", "tensor(float)"]
    with pytest.raises(PlaitError, match="'xs' is a sequence"):
        sess.run(None, {"xs": xs[0], "bias": np.zeros(3, np.float32)})


def test_optional_round_trip() -> None:
    opt = h.make_optional_type_proto(h.make_tensor_type_proto(F, [2]))
    nodes = [
        h.make_node("OptionalHasElement", ["o"], ["has"]),
        h.make_node("Identity", ["o"], ["same"]),
    ]
    g = h.make_graph(
        nodes,
        "g",
        [h.make_value_info("o", opt)],
        [_vi("has", T.BOOL, []), h.make_value_info("same", opt)],
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10).SerializeToString()
    sess = InferenceSession(model, device="cpu")
    has, same = sess.run(None, {"o": None})
    assert has.dtype == np.bool_ and not has and same is None
    has, same = sess.run(None, {"o": np.array([1.0, 2.0], np.float32)})
    assert has and same.tolist() == [1.0, 2.0]


def test_get_element_of_an_empty_optional_is_an_error() -> None:
    nodes = [
        h.make_node("Optional", [], ["o"], name="none", type=h.make_tensor_type_proto(F, [2])),
        h.make_node("OptionalGetElement", ["o"], ["y"], name="get"),
    ]
    model = _model(nodes, [], [_vi("y", F, [2])])
    with pytest.raises(OnnxModelError, match=r"node 'get' \(OptionalGetElement\).*empty"):
        InferenceSession(model, device="cpu").run(None, {})


def test_a_sequence_given_to_a_tensor_op_is_refused() -> None:
    nodes = [h.make_node("SequenceConstruct", ["x", "x"], ["s"]), h.make_node("Relu", ["s"], ["y"], name="relu")]
    g = h.make_graph(nodes, "g", [_vi("x", F, [2])], [_vi("y", F, [2])])
    model = h.make_model(
        g, opset_imports=[h.make_opsetid("", 18)], ir_version=10
    ).SerializeToString()  # the checker would refuse it
    with pytest.raises(OnnxUnsupportedError, match=r"node 'relu' \(Relu\).*sequence"):
        InferenceSession(model, device="cpu").run(None, {"x": np.ones(2, np.float32)})


def test_an_empty_optional_given_to_a_tensor_op_is_refused() -> None:
    nodes = [
        h.make_node("Optional", [], ["o"], type=h.make_tensor_type_proto(F, [2])),
        h.make_node("Add", ["x", "o"], ["y"], name="add"),
    ]
    g = h.make_graph(nodes, "g", [_vi("x", F, [2])], [_vi("y", F, [2])])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 18)], ir_version=10).SerializeToString()
    with pytest.raises(OnnxUnsupportedError, match=r"node 'add' \(Add\): input 'o' is an empty optional"):
        InferenceSession(model, device="cpu").run(None, {"x": np.ones(2, np.float32)})


def test_sequence_position_out_of_range_is_an_error() -> None:
    nodes = [
        h.make_node("SequenceConstruct", ["x", "x"], ["s"]),
        h.make_node("Constant", [], ["p"], value=h.make_tensor("p", T.INT64, [], [2])),
        h.make_node("SequenceAt", ["s", "p"], ["y"], name="at"),
    ]
    model = _model(nodes, [_vi("x", F, [2])], [_vi("y", F, [2])])
    with pytest.raises(OnnxModelError, match=r"node 'at' \(SequenceAt\): position \[2\] is out of range.*-2 to 1"):
        InferenceSession(model, device="cpu").run(None, {"x": np.ones(2, np.float32)})


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # raised while onnx generates its other node tests
def test_loop16_seq_none_node_test_gives_the_reference_sequence() -> None:
    """onnx's runner cannot compare this node test's output (a sequence of 0-d tensors), so it stays excluded from
    the conformance suite; this compares it element by element instead."""
    (case,) = [c for c in load_node_model_tests() if c.name == "test_loop16_seq_none"]
    assert case.model is not None and case.data_sets is not None
    sess = InferenceSession(case.model, device="cpu")
    for inputs, outputs in case.data_sets:
        _same(sess.run(None, dict(zip([i.name for i in sess.get_inputs()], inputs, strict=True))), list(outputs))


def test_plait_run_writes_sequence_outputs_element_by_element(tmp_path: Any, capsys: Any) -> None:
    nodes = [h.make_node("SplitToSequence", ["x"], ["s"], axis=0), h.make_node("Relu", ["x"], ["y"])]
    outs = [_seq_vi("s", F, [1, 2]), _vi("y", F, [3, 2])]
    (tmp_path / "m.onnx").write_bytes(_model(nodes, [_vi("x", F, [3, 2])], outs))
    x = np.arange(6, dtype=np.float32).reshape(3, 2) - 2
    np.save(tmp_path / "x.npy", x)
    argv = ["run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}", "--device", "cpu", "--repeat", "0"]
    assert main(argv) == 0
    assert "s[2]: shape (1, 2) float32" in capsys.readouterr().out
    saved = np.load(tmp_path / "m.outputs.npz")
    assert sorted(saved.files) == ["s[0]", "s[1]", "s[2]", "y"]
    np.testing.assert_array_equal(saved["s[1]"], x[1:2])
    np.testing.assert_array_equal(saved["y"], np.maximum(x, 0))
