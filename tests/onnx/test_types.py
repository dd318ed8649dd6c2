"""ONNX element types: Cast/CastLike into and out of bfloat16, float8, float4, e8m0 and int4/int2 (rounded on the
device), BitCast, and the quantization ops, each against onnx's ReferenceEvaluator; and the errors."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from plait import PlaitError
from plait.onnx import InferenceSession
from plait.onnx.errors import OnnxModelError, OnnxUnsupportedError

OPSET = 26  # BitCast is new in 26


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, int, list[int]]],
    outputs: list[tuple[Any, ...]],
    inits: list[onnx.TensorProto] | None = None,
) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(o[0], o[1], o[2] if len(o) > 2 else None) for o in outputs],
        inits or [],
    )
    # the checker wants output shapes: inference fills in those not given
    return onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)]))


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal dtype, shape and values (NaN where the reference has NaN; the sign of zero counts)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(g[~nan], w[~nan])
    np.testing.assert_array_equal(np.signbit(g[~nan]), np.signbit(w[~nan]))


def _check(model: onnx.ModelProto, feed: dict[str, np.ndarray], device: str) -> list[np.ndarray]:
    got = InferenceSession(model.SerializeToString(), device=device).run(None, feed)
    want = ReferenceEvaluator(model).run(None, feed)
    for g, w in zip(got, want, strict=True):
        _same(g, np.asarray(w))
    return got


def _edge_values() -> np.ndarray:
    """Ties, subnormals, overflow and specials of the narrow formats, plus a log-uniform spread."""
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(400) * 10.0 ** rng.integers(-10, 10, 400)
    special = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-7, -1e-7, 448, 464, 465, 480, 240, 248, 57344, 61440, 61441]
    special += [6, 5, 7, 0.25, 0.75, 2.0**-9, 1.5 * 2.0**-9, 2.0**-17, 3.4e38, 1e-40, 2.0**-133, 3 * 2.0**-135]
    return np.concatenate([spread, special]).astype(np.float32)


@pytest.mark.parametrize(
    "to", [TP.BFLOAT16, TP.FLOAT8E4M3FN, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2, TP.FLOAT8E5M2FNUZ, TP.FLOAT4E2M1]
)
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_float_formats_round_like_onnx(to: int, saturate: int, device: str) -> None:
    """float32 -> narrow float inside a graph, then back to float32: the device rounding is the reference's."""
    if to == TP.FLOAT4E2M1 or to == TP.BFLOAT16:
        saturate = 1  # the attribute applies to float8 only
    nodes = [
        helper.make_node("Cast", ["x"], ["n"], to=to, saturate=saturate),
        helper.make_node("Cast", ["n"], ["y"], to=TP.FLOAT),
    ]
    x = _edge_values()
    if to == TP.FLOAT4E2M1:
        x = x[~np.isnan(x)]  # ml_dtypes turns NaN into a signed zero there; plait gives +0
    _check(_model(nodes, [("x", TP.FLOAT, [x.size])], [("n", to), ("y", TP.FLOAT)]), {"x": x}, device)


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_cast_e8m0_round_modes(mode: str, device: str) -> None:
    x = np.abs(_edge_values())
    node = helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E8M0, round_mode=mode)
    _check(_model([node], [("x", TP.FLOAT, [x.size])], [("y", TP.FLOAT8E8M0)]), {"x": x}, device)


@pytest.mark.parametrize("to", [TP.INT4, TP.UINT4, TP.INT2, TP.UINT2, TP.INT8, TP.UINT8])
def test_cast_to_narrow_integers_wraps(to: int, device: str) -> None:
    """Integers wrap as two's complement inside the graph (Cast to int4 then to int32 keeps the wrapped value)."""
    x = np.arange(-40, 300, dtype=np.int32)
    nodes = [helper.make_node("Cast", ["x"], ["n"], to=to), helper.make_node("Cast", ["n"], ["y"], to=TP.INT32)]
    got = _check(_model(nodes, [("x", TP.INT32, [x.size])], [("n", to), ("y", TP.INT32)]), {"x": x}, device)
    assert got[0].dtype == np.dtype(helper.tensor_dtype_to_np_dtype(to))


def test_castlike_takes_the_declared_type_of_its_target(device: str) -> None:
    """The target is a float8 input, stored as float32 on the device: CastLike still rounds to float8."""
    node = helper.make_node("CastLike", ["x", "like"], ["y"], saturate=0)
    model = _model([node], [("x", TP.FLOAT, [6]), ("like", TP.FLOAT8E5M2, [1])], [("y", TP.FLOAT8E5M2)])
    x = np.array([0.47892547, 1e6, -1e-7, 3.0, np.nan, -70000], np.float32)
    _check(model, {"x": x, "like": np.zeros(1, ml_dtypes.float8_e5m2)}, device)


def test_narrow_initializers_and_outputs_cross_the_boundary(device: str) -> None:
    """A packed int4 initializer and a float8 graph input are unpacked on the host; results are packed back."""
    w = numpy_helper.from_array(np.array([-8, -1, 0, 3, 7], ml_dtypes.int4), "w")
    nodes = [
        helper.make_node("Cast", ["w"], ["wf"], to=TP.FLOAT),
        helper.make_node("Cast", ["x"], ["xf"], to=TP.FLOAT),
        helper.make_node("Mul", ["wf", "xf"], ["p"]),
        helper.make_node("Cast", ["p"], ["y"], to=TP.FLOAT8E4M3FN),
    ]
    model = _model(nodes, [("x", TP.FLOAT8E4M3FN, [5])], [("y", TP.FLOAT8E4M3FN)], [w])
    x = np.array([1.5, 2.0, -3.0, 0.875, 100.0], ml_dtypes.float8_e4m3fn)
    (y,) = _check(model, {"x": x}, device)
    assert y.astype(np.float32).tolist() == [-12.0, -2.0, -0.0, 2.5, 448.0]


@pytest.mark.parametrize(("src", "to"), [(TP.FLOAT, TP.INT32), (TP.INT32, TP.FLOAT), (TP.UINT32, TP.FLOAT)])
def test_bitcast_32_bit(src: int, to: int, device: str) -> None:
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, 3000, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([bits, np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 1, 0x807FFFFF], np.uint32)])
    x = bits.view(helper.tensor_dtype_to_np_dtype(src))
    if src == TP.FLOAT:
        x = x[~np.isnan(x)]  # NaN payloads are not kept (plait has no bit-level view of its buffers)
    else:
        x = x[~np.isnan(bits.view(np.float32))]
    node = helper.make_node("BitCast", ["x"], ["y"], to=to)
    _check(_model([node], [("x", src, [x.size])], [("y", to, [x.size])]), {"x": x}, device)


def test_bitcast_float16_and_small_integers(device: str) -> None:
    h = np.arange(0, 2**16, 7, dtype=np.uint16)
    h = h[~np.isnan(h.view(np.float16))]
    nodes = [
        helper.make_node("BitCast", ["h"], ["f"], to=TP.FLOAT16),
        helper.make_node("BitCast", ["f"], ["i"], to=TP.INT16),
        helper.make_node("BitCast", ["b"], ["u"], to=TP.UINT8),
    ]
    model = _model(
        nodes,
        [("h", TP.UINT16, [h.size]), ("b", TP.INT8, [256])],
        [("f", TP.FLOAT16, [h.size]), ("i", TP.INT16, [h.size]), ("u", TP.UINT8, [256])],
    )
    _check(model, {"h": h, "b": np.arange(-128, 128, dtype=np.int8)}, device)


def _quant_model(op: str, ins: list[tuple[str, int, list[int]]], out: int, **attrs: Any) -> onnx.ModelProto:
    node = helper.make_node(op, [n for n, _, _ in ins], ["y"], **attrs)
    return _model([node], ins, [("y", out)])


@pytest.mark.parametrize("zp_type", [TP.UINT8, TP.INT8, TP.INT4, TP.UINT16])
def test_quantize_dequantize_per_axis(zp_type: int, device: str) -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2, 3, 4)) * 40).astype(np.float32)
    x[0, 0, :2] = [2.5, -3.5]  # ties round to even
    scale = np.array([0.5, 1.0, 2.0], np.float32)
    zpd = helper.tensor_dtype_to_np_dtype(zp_type)
    zp = np.array([1, 0, 3], zpd)
    q = _quant_model(
        "QuantizeLinear", [("x", TP.FLOAT, [2, 3, 4]), ("s", TP.FLOAT, [3]), ("zp", zp_type, [3])], zp_type, axis=1
    )
    (y,) = _check(q, {"x": x, "s": scale, "zp": zp}, device)
    d = _quant_model(
        "DequantizeLinear", [("q", zp_type, [2, 3, 4]), ("s", TP.FLOAT, [3]), ("zp", zp_type, [3])], TP.FLOAT, axis=1
    )
    _check(d, {"q": y, "s": scale, "zp": zp}, device)


def test_quantize_ties_survive_the_division(device: str) -> None:
    """Values whose x / scale is exactly half-way between integers round to even on every device, including those
    whose division is approximate (the quotient is corrected to the nearest float32 first)."""
    rng = np.random.default_rng(7)
    scale = np.float32(0.3711)
    k = rng.integers(-120, 120, 4000).astype(np.float32) + np.float32(0.5)
    x = (k * scale).astype(np.float32)
    x = np.concatenate([x[x / scale == k], (rng.standard_normal(1000) * 30).astype(np.float32)])
    model = _quant_model("QuantizeLinear", [("x", TP.FLOAT, [x.size]), ("s", TP.FLOAT, [])], TP.INT8, output_dtype=3)
    _check(model, {"x": x, "s": np.array(scale)}, device)


def test_quantize_blocked_with_a_partial_block(device: str) -> None:
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 5)) * 20).astype(np.float32)
    scale = np.abs(rng.standard_normal((3, 3))).astype(np.float32) + 0.1
    zp = rng.integers(0, 20, (3, 3)).astype(np.uint8)
    model = _quant_model(
        "QuantizeLinear",
        [("x", TP.FLOAT, [3, 5]), ("s", TP.FLOAT, [3, 3]), ("zp", TP.UINT8, [3, 3])],
        TP.UINT8,
        axis=1,
        block_size=2,
    )
    _check(model, {"x": x, "s": scale, "zp": zp}, device)


@pytest.mark.parametrize("to", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2])
def test_quantize_to_float8_saturates(to: int, device: str) -> None:
    x = np.array([0.3, -1000.0, 1e6, 2.0**-12, np.inf], np.float32)
    zp = np.zeros(1, helper.tensor_dtype_to_np_dtype(to))
    model = _quant_model("QuantizeLinear", [("x", TP.FLOAT, [5]), ("s", TP.FLOAT, []), ("zp", to, [1])], to)
    _check(model, {"x": x, "s": np.array(0.5, np.float32), "zp": zp}, device)


def test_dynamic_quantize_linear(device: str) -> None:
    x = np.random.default_rng(4).standard_normal((4, 7)).astype(np.float32) * 3 + 1
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "zp"])
    model = _model([node], [("x", TP.FLOAT, [4, 7])], [("y", TP.UINT8), ("s", TP.FLOAT), ("zp", TP.UINT8)])
    _check(model, {"x": x}, device)


def test_integer_products_accumulate_exactly(device: str) -> None:
    """MatMulInteger with a long reduction (sums beyond 2**24) and per-row / per-column zero points, against
    NumPy in int64 (onnx's reference broadcasts a per-row zero point along the wrong axis)."""
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, (3, 1200)).astype(np.uint8)
    b = rng.integers(0, 256, (1200, 4)).astype(np.uint8)
    model = _quant_model(
        "MatMulInteger",
        [("a", TP.UINT8, [3, 1200]), ("b", TP.UINT8, [1200, 4]), ("az", TP.UINT8, [3]), ("bz", TP.UINT8, [4])],
        TP.INT32,
    )
    az, bz = np.array([0, 200, 7], np.uint8), np.array([1, 2, 255, 0], np.uint8)
    (y,) = InferenceSession(model, device=device).run(None, {"a": a, "b": b, "az": az, "bz": bz})
    want = (a.astype(np.int64) - az[:, None]) @ (b.astype(np.int64) - bz)
    assert y.dtype == np.int32 and np.abs(want).max() > 2**24
    np.testing.assert_array_equal(y, want)


def test_qlinear_matmul_and_conv(device: str) -> None:
    rng = np.random.default_rng(6)
    s = {n: np.array([v], np.float32) for n, v in [("as", 0.02), ("bs", 0.05), ("ys", 0.3)]}
    feed = {
        "a": rng.integers(-128, 128, (2, 5, 8)).astype(np.int8),
        "az": np.array([3], np.int8),
        "b": rng.integers(-128, 128, (8, 3)).astype(np.int8),
        "bz": np.array([-2], np.int8),
        "yz": np.array([5], np.int8),
        **s,
    }
    names = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    types = {n: TP.FLOAT if n.endswith("s") else TP.INT8 for n in names}
    model = _quant_model("QLinearMatMul", [(n, types[n], list(feed[n].shape)) for n in names], TP.INT8)
    _check(model, feed, device)
    x = rng.integers(0, 256, (1, 2, 6, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8)
    cfeed = {
        "x": x,
        "xs": np.array(0.1, np.float32),
        "xz": np.array(120, np.uint8),
        "w": w,
        "ws": np.array([0.01, 0.02, 0.03], np.float32),
        "wz": np.array([128, 100, 90], np.uint8),
        "ys": np.array(0.7, np.float32),
        "yz": np.array(10, np.uint8),
        "bias": np.array([100, -2000, 5], np.int32),
    }
    cnames = list(cfeed)
    ctypes = {n: {"f": TP.FLOAT, "u": TP.UINT8, "i": TP.INT32}[cfeed[n].dtype.kind] for n in cnames}
    conv = _quant_model(
        "QLinearConv", [(n, ctypes[n], list(cfeed[n].shape)) for n in cnames], TP.UINT8, pads=[1, 1, 1, 1]
    )
    _check(conv, cfeed, device)


def test_errors_name_the_node_and_the_way_out() -> None:
    double = _model(
        [helper.make_node("BitCast", ["x"], ["y"], to=TP.INT64, name="bc")],
        [("x", TP.DOUBLE, [2])],
        [("y", TP.INT64, [2])],
    )
    with pytest.raises(OnnxUnsupportedError, match=r"'bc'.*BitCast of double"):
        InferenceSession(double.SerializeToString(), device="cpu").run(None, {"x": np.zeros(2)})
    width = _model(
        [helper.make_node("BitCast", ["x"], ["y"], to=TP.INT16, name="bw")],
        [("x", TP.FLOAT, [2])],
        [("y", TP.INT16, [2])],
    )
    with pytest.raises(PlaitError, match=r"'bw'.*bit width"):
        InferenceSession(width.SerializeToString(), device="cpu").run(None, {"x": np.zeros(2, np.float32)})
    mode = _model(
        [helper.make_node("Cast", ["x"], ["y"], to=TP.FLOAT8E8M0, round_mode="sideways", name="c")],
        [("x", TP.FLOAT, [2])],
        [("y", TP.FLOAT8E8M0)],
    )
    with pytest.raises(PlaitError, match="round_mode 'sideways'"):
        InferenceSession(mode, device="cpu").run(None, {"x": np.ones(2, np.float32)})
    blocked = _quant_model(
        "QuantizeLinear", [("x", TP.FLOAT, [3, 4]), ("s", TP.FLOAT, [3, 3])], TP.UINT8, axis=1, block_size=2
    )
    with pytest.raises(OnnxModelError, match=r"block_size 2 needs \(3, 2\)"):
        InferenceSession(blocked, device="cpu").run(
            None, {"x": np.ones((3, 4), np.float32), "s": np.ones((3, 3), np.float32)}
        )
