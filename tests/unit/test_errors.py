"""Bad input is a PlaitError subclass whose message names the op, the shapes and what to do (no kernel is built)."""

import numpy as np
import pytest

import plait
from plait.runtime import canonical


def z(*shape, dtype="float32"):
    return plait.Tensor.zeros(*shape, dtype=dtype, device="cpu")


def test_hierarchy():
    for cls in (plait.ShapeError, plait.DTypeError, plait.DeviceError, plait.CompileError, plait.UnsupportedError):
        assert issubclass(cls, plait.PlaitError)
    assert issubclass(plait.ShapeError, ValueError) and issubclass(plait.DTypeError, TypeError)


@pytest.mark.parametrize("name", ["cuda:7", "tpu", "opencl:x", "cpu:1", "gpu:0"])
def test_unknown_device_strings(name):
    with pytest.raises(plait.DeviceError, match="unknown device") as e:
        plait.tensor([1.0], device=name)
    assert "plait devices" in str(e.value)  # what to do next


def test_missing_opencl_index_names_the_devices_there_are():
    with pytest.raises(plait.DeviceError, match=r"opencl:99") as e:
        plait.tensor([1.0], device="opencl:99")
    assert "plait devices" in str(e.value)


def test_device_must_be_a_string():
    with pytest.raises(plait.DeviceError):
        canonical(3)  # type: ignore[arg-type]


def test_device_strings_are_normalised():
    assert canonical(" CPU ") == "cpu"
    assert plait.tensor([1.0], device="CPU").device == "cpu"


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: z(2, 3) + z(4), ["add", "(2, 3)", "(4,)", "broadcast"]),
        (lambda: z(2, 3) < z(3, 2), ["cmplt", "(2, 3)", "(3, 2)"]),
        (lambda: plait.where(z(2, dtype="bool"), z(3), z(2)), ["where", "(3,)"]),
        (lambda: z(2, 3) @ z(4, 5), ["matmul", "(2, 3)", "(4, 5)"]),
        (lambda: z(2, 2, 3) @ z(3, 3, 5), ["matmul", "(2,)", "(3,)"]),
        (lambda: plait.matmul(z(), z(2)), ["matmul", "()"]),
        (lambda: z(2, 3).reshape(4, 2), ["reshape", "(2, 3)", "(4, 2)"]),
        (lambda: z(2, 3).reshape(-2, -3), ["reshape", "(2, 3)"]),
        (lambda: z(2, 3).reshape(-1, 4), ["reshape", "(2, 3)"]),
        (lambda: plait.cat([z(2, 3), z(3, 2)]), ["cat", "(2, 3)", "(3, 2)"]),
        (lambda: z(2, 3).expand(4, 3), ["expand", "(2, 3)", "(4, 3)"]),
        (lambda: z(2, 3).permute(0, 0), ["permute", "(2, 3)"]),
        (lambda: z(2, 3).sum(axis=2), ["sum", "axis 2"]),
        (lambda: z(0, 3).max(axis=0), ["max", "(0, 3)"]),
        (lambda: z(0, 3).argmax(axis=0), ["argmax", "(0, 3)"]),
        (lambda: z(2, 3)[5], ["index 5", "(2, 3)"]),
        (lambda: z(2, 3)[0, 0, 0], ["too many", "(2, 3)"]),
        (lambda: z(2).pad(((1, 1), (1, 1))), ["pad", "(2,)"]),
        (lambda: z(5).split([2, 2]), ["split", "(5,)"]),
        (lambda: z(2).item(), ["item", "(2,)"]),
    ],
)
def test_shape_errors_name_op_and_shapes(build, words):
    with pytest.raises(plait.ShapeError) as e:
        build()
    for w in words:
        assert w in str(e.value), f"{w!r} missing from: {e.value}"


def test_dtype_errors():
    with pytest.raises(plait.DTypeError, match="bitwise_and"):
        z(3) & z(3)
    with pytest.raises(plait.DTypeError, match="bitwise_not"):
        ~z(3)
    with pytest.raises(plait.DTypeError, match="str"):
        z(3) + "a"
    with pytest.raises(plait.PlaitError, match="floating-point"):
        plait.tensor([1, 2], device="cpu", requires_grad=True)


def test_backward_errors():
    x = plait.tensor([1.0, 2.0], device="cpu", requires_grad=True)
    with pytest.raises(plait.ShapeError, match=r"\(2,\)"):
        (x * 2).backward()
    with pytest.raises(plait.PlaitError, match="does not require grad"):
        z(2).sum().backward()


def test_mixed_devices_are_refused():
    a = plait.tensor(np.ones(2, np.float32), device="cpu")
    b = plait.Tensor.zeros(2, device="cpu")
    b.node.device = "opencl:0"  # a tensor that claims another device; no OpenCL needed
    with pytest.raises(plait.DeviceError, match=r"\.to\(\)"):
        a + b
