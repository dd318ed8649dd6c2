"""dtype names, NumPy mapping, narrowing and the promotion table (no device needed)."""

import numpy as np
import pytest

import plait
from plait import dtypes
from plait.frontends.native.tensor import broadcast_shape

ALL = ["bool", "int32", "int64", "float16", "float32"]


@pytest.mark.parametrize("name", ALL)
def test_to_dtype_accepts_names_numpy_dtypes_and_dtypes(name):
    dt = dtypes.to_dtype(name)
    assert dt.name == name
    assert dtypes.to_dtype(np.dtype(dt.np)) is dt
    assert dtypes.to_dtype(dt) is dt


def test_float64_is_narrowed_to_float32():
    assert dtypes.to_dtype("float64") is plait.float32
    assert dtypes.to_dtype(float) is plait.float32
    assert dtypes.from_numpy_dtype(np.dtype(np.float64)) is plait.float32
    t = plait.tensor(np.array([0.1, 1e30, -2.5]), device="cpu")
    assert t.dtype is plait.float32
    np.testing.assert_array_equal(t.numpy(), np.array([0.1, 1e30, -2.5], dtype=np.float32))


def test_small_ints_widen_to_int32():
    for npd in (np.int8, np.int16, np.uint8, np.uint16):
        assert dtypes.from_numpy_dtype(np.dtype(npd)) is plait.int32


@pytest.mark.parametrize("bad", ["complex64", np.complex128, "uint64", np.uint32, "banana", "U3", object])
def test_unsupported_dtypes_raise_dtype_error_naming_the_choices(bad):
    with pytest.raises(plait.DTypeError) as e:
        dtypes.to_dtype(bad)
    assert isinstance(e.value, plait.PlaitError)
    assert "float32" in str(e.value) and "astype" in str(e.value)


def test_unsupported_array_dtype_raises_on_tensor_creation():
    with pytest.raises(plait.DTypeError, match="complex128"):
        plait.tensor(np.ones(3, np.complex128), device="cpu")
    with pytest.raises(plait.DTypeError):
        plait.tensor([1.0], dtype="complex64", device="cpu")


def _numpy_promote(a: str, b: str) -> str:
    r = np.result_type(np.dtype(a if a != "bool" else np.bool_), np.dtype(b if b != "bool" else np.bool_))
    return dtypes.from_numpy_dtype(r).name


@pytest.mark.parametrize("a", ALL)
@pytest.mark.parametrize("b", ALL)
def test_tensor_promotion_follows_numpy(a, b):
    assert dtypes.promote(dtypes.to_dtype(a), dtypes.to_dtype(b)).name == _numpy_promote(a, b)
    x = plait.Tensor.zeros(2, dtype=a, device="cpu")
    y = plait.Tensor.zeros(2, dtype=b, device="cpu")
    assert (x * y).dtype.name == _numpy_promote(a, b)
    assert (x < y).dtype is plait.bool_


@pytest.mark.parametrize(
    ("dtype", "scalar", "want"),
    [
        ("int32", 3, "int32"),  # weak Python scalars keep the tensor's dtype (PyTorch)
        ("int32", 2.5, "float32"),
        ("float16", 2.5, "float16"),
        ("float16", 3, "float16"),
        ("int64", True, "int64"),
        ("bool", 3, "int64"),
        ("bool", 2.5, "float32"),
        ("bool", True, "bool"),
        ("float32", 7, "float32"),
    ],
)
def test_python_scalars_are_weak_like_pytorch(dtype, scalar, want):
    import torch

    x = plait.Tensor.zeros(2, dtype=dtype, device="cpu")
    assert (x + scalar).dtype.name == want
    assert (scalar * x).dtype.name == want
    assert str((torch.zeros(2, dtype=getattr(torch, dtype)) + scalar).dtype) == f"torch.{want}"


@pytest.mark.parametrize("a", ["bool", "int32", "int64"])
@pytest.mark.parametrize("b", ["bool", "int32", "int64"])
def test_true_division_of_integers_gives_float32(a, b):
    x = plait.Tensor.ones(2, dtype=a, device="cpu")
    y = plait.Tensor.ones(2, dtype=b, device="cpu")
    assert (x / y).dtype is plait.float32
    assert (x / 2).dtype is plait.float32


def test_integer_pow_and_sum_dtypes():
    x = plait.Tensor.ones(2, dtype="int32", device="cpu")
    assert (x**2).dtype is plait.int32
    assert x.sum().dtype is plait.int64  # NumPy and PyTorch accumulate small integers in int64
    assert plait.Tensor.ones(2, dtype="bool", device="cpu").sum().dtype is plait.int64
    assert x.mean().dtype is plait.float32
    assert x.max().dtype is plait.int32


def test_broadcast_shape_error_names_op_and_shapes():
    with pytest.raises(plait.ShapeError, match=r"add: shapes \(2, 3\) and \(4,\)"):
        broadcast_shape((2, 3), (4,), op="add")
