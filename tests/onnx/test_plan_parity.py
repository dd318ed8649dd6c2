"""The ONNX path builds the same plan as plait's own model: a resnet-like net exported from PyTorch (the exporter
folds BatchNormalization into the convolutions) and run by plait.onnx compiles to the kernels of its plait.nn twin
with the same weights, kind for kind, and agrees with ONNX Runtime. Pools pinned on their own: a small window is
one elementwise kernel over its strided views, not a chain of reductions (resnet's 3x3/2 max pool was 5x slower
as two separable reductions)."""

from __future__ import annotations

import collections
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import plait
import plait.nn as pnn
import plait.nn.functional as F
from plait.models import architectures
from plait.onnx import InferenceSession
from plait.schedule.plan import Plan
from tests.onnx.conftest import export, ort_run


def _tiny_resnet(nn: ModuleType) -> Any:
    """resnet18's stem (7x7/2 convolution, BN, ReLU, 3x3/2 max pool), one basic block and its head, narrow."""
    blocks = architectures.classes(nn)

    class TinyResNet(nn.Module):  # type: ignore[name-defined,misc]
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 8, kernel_size=7, stride=2, padding=3, bias=False)
            self.bn1 = nn.BatchNorm2d(8)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
            self.layer1 = blocks.BasicBlock(8, 8)
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(8, 10)

        def forward(self, x: Any) -> Any:
            x = self.layer1(self.maxpool(self.relu(self.bn1(self.conv1(x)))))
            return self.fc(self.avgpool(x).flatten(1))

    return TinyResNet()


def _kinds(plan: Plan | None) -> collections.Counter[str]:
    """Kernels per kind (the name's prefix: CONV, WINO4, E, R, GEMV...)."""
    assert plan is not None
    return collections.Counter(k.name.split("_")[0] for k in plan.kernels)


def test_resnet_block_plan_matches_the_twin_and_onnxruntime() -> None:
    torch.manual_seed(0)
    net = _tiny_resnet(torch.nn)
    with torch.no_grad():  # BN statistics away from the identity, so the folded weights matter
        for bn in (net.bn1, net.layer1.bn1, net.layer1.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    model = export(net, (torch.from_numpy(x),), dynamic_batch=True)
    sess = InferenceSession(model, device="cpu")
    got = sess.run(None, {"input0": x})[0]
    want = ort_run(model, {"input0": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))

    twin = _tiny_resnet(pnn)
    twin.load_state_dict({k: v.detach().numpy() for k, v in net.state_dict().items()})
    twin.eval()
    f = plait.jit(lambda t: twin(t), device="cpu")
    np.testing.assert_allclose(f(x), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    onnx_kinds, twin_kinds = _kinds(sess.plan_for({"input0": x})), _kinds(f.plan_for([x])[0])
    assert onnx_kinds == twin_kinds
    assert "R" in onnx_kinds and onnx_kinds["R"] == 1  # the global average pool; the max pool is no reduction


@pytest.mark.parametrize(
    ("op", "attrs"),
    [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
        ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 1, 1, 0]}),
        ("LpPool", {"kernel_shape": [3, 3], "p": 2}),
    ],
)
def test_small_window_pool_is_one_kernel(op: str, attrs: dict[str, Any]) -> None:
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9).SerializeToString()
    x = np.random.default_rng(1).standard_normal((1, 4, 9, 11)).astype(np.float32)
    sess = InferenceSession(model, device="cpu")
    want = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    # max pooling is the cpu's pooling kernel (plait/codegen/pool_c.py); the other pools one elementwise chain
    assert _kinds(sess.plan_for({"x": x})) == collections.Counter({"POOL" if op == "MaxPool" else "E": 1})


@pytest.mark.parametrize("rows", [1, 4])
def test_gemm_with_trans_b_builds_the_kernel_of_a_linear_layer(rows: int) -> None:
    """Gemm(transB=1) reads its (out, in) weight through a transposed view, as plait.nn.functional.linear does,
    rather than a copy transposed on the host (the product kernels stream a K-contiguous weight faster)."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    x = rng.standard_normal((rows, 40)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 24])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
            helper.make_tensor("b", TensorProto.FLOAT, [24], b),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()
    sess = InferenceSession(model, device="cpu")
    want = ort_run(model, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.linear(t, wt, bt), device="cpu")
    np.testing.assert_allclose(f(x), want, rtol=1e-5, atol=1e-5)
    onnx_plan, linear_plan = sess.plan_for({"x": x}), f.plan_for([x])[0]
    assert onnx_plan is not None
    assert [k.source for k in onnx_plan.kernels] == [k.source for k in linear_plan.kernels]


@pytest.mark.parametrize(("opset", "bias"), [(10, True), (13, True), (13, False)])
def test_clip_with_constant_bounds_fuses_and_keeps_nan(opset: int, bias: bool) -> None:
    """Conv + Clip(0, 6) (mobilenet_v2's ReLU6 as exported, the convolution with the folded BN's bias) is one
    kernel: with a bias the epilogue clips with selects, without one with maximum/minimum. NaN and infinities come
    out as ONNX Runtime gives them. Opsets below 11 carry the bounds as attributes."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 3, 1, 1)).astype(np.float32)
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32) * 8
    x[0, :, 0, 0] = [np.nan, np.inf, -np.inf]
    inits = [
        helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
        helper.make_tensor("b", TensorProto.FLOAT, [6], rng.standard_normal(6).astype(np.float32)),
    ]
    if opset < 11:
        clip = helper.make_node("Clip", ["h"], ["y"], min=0.0, max=6.0)
    else:
        clip = helper.make_node("Clip", ["h", "lo", "hi"], ["y"])
        inits += [
            helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0]),
        ]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["h"]), clip],
        "conv_clip",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 5, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9).SerializeToString()
    sess = InferenceSession(model, device="cpu")
    got = sess.run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert np.isnan(got[0, :, 0, 0]).all()  # NaN, inf - inf and so on: the first pixel mixes NaN into every channel
    plan = sess.plan_for({"x": x})
    assert plan is not None and len(plan.kernels) == 1


@pytest.mark.parametrize("batch", [1, 3])
def test_one_cell_average_pool_before_the_classifier_is_no_kernel(batch: int) -> None:
    """alexnet's and vgg16's head as torch exports it: AdaptiveAvgPool2d over a map already of its output size
    becomes a 1x1 AveragePool, which is a view; the classifier's GEMM reads the max pool's output directly instead
    of through a division by ones. Agrees with ONNX Runtime."""
    torch.manual_seed(4)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.AdaptiveAvgPool2d((3, 3)),
        torch.nn.Flatten(),
        torch.nn.Linear(72, 5),
    ).eval()
    x = np.random.default_rng(5).standard_normal((batch, 3, 6, 6)).astype(np.float32)
    model = export(net, (torch.from_numpy(x),))
    sess = InferenceSession(model, device="cpu")
    want = ort_run(model, {"input0": x})[0]
    np.testing.assert_allclose(sess.run(None, {"input0": x})[0], want, rtol=1e-5, atol=1e-5)
    kinds = _kinds(sess.plan_for({"input0": x}))
    assert "E" not in kinds and sum(kinds.values()) == 3, kinds  # convolution, max pool, classifier


def test_average_pool_of_one_cell_windows_with_stride_matches_onnxruntime() -> None:
    """A 1x1 AveragePool with stride 2 (every window counts one cell) is a strided view of its input."""
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[1, 1], strides=[2, 2])
    graph = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9).SerializeToString()
    x = np.random.default_rng(6).standard_normal((2, 3, 5, 6)).astype(np.float32)
    want = ort_run(model, {"x": x})[0]
    np.testing.assert_array_equal(InferenceSession(model, device="cpu").run(None, {"x": x})[0], want)
