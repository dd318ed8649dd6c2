"""Casts between every pair of dtypes against NumPy's astype, and realize()/numpy() round trips per dtype."""

import numpy as np
import pytest

import plait

DTYPES = ["bool", "int32", "int64", "float16", "float32"]
FLOATS = np.array([-3.75, -1.0, -0.5, 0.0, 0.1, 0.5, 1.0, 2.5, 100.3, 65000.0], dtype=np.float32)
INTS = np.array([-3, -1, 0, 0, 1, 2, 7, 100, 2049, 60000], dtype=np.int64)
SOURCES = {
    "bool": FLOATS != 0,
    "int32": INTS.astype(np.int32),
    "int64": INTS + np.array([0] * 9 + [2**33], dtype=np.int64),  # wraps when narrowed to int32
    "float16": FLOATS.astype(np.float16),
    "float32": FLOATS,
}


@pytest.mark.parametrize("dst", DTYPES)
def test_cast_from_every_dtype(device, dst):
    ts = {src: plait.tensor(a, device=device) for src, a in SOURCES.items()}
    outs = [t.astype(dst) for t in ts.values()]
    assert all(o.dtype.name == dst for o in outs)
    got = plait.stack(outs).numpy()
    assert got.dtype == np.dtype(dst)
    for i, (src, a) in enumerate(SOURCES.items()):
        with np.errstate(over="ignore"):
            want = a.astype(dst)
        np.testing.assert_array_equal(got[i], want, err_msg=f"{src} -> {dst} on {device}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_and_realize(device, dtype):
    a = SOURCES[dtype].reshape(2, 5)
    t = plait.tensor(a, device=device)
    assert t.dtype.name == dtype and t.shape == (2, 5)
    np.testing.assert_array_equal(t.numpy(), a)
    r = t.T.realize()  # a view made into its own buffer
    assert r is not None and r.node.realized
    np.testing.assert_array_equal(r.numpy(), a.T)
    assert t.tolist() == a.tolist()


def test_float64_input_is_computed_in_float32(device):
    a = np.array([1 / 3, 1e-40, 3e38], dtype=np.float64)
    t = plait.tensor(a, device=device)
    assert t.dtype is plait.float32
    np.testing.assert_array_equal((t * 1).numpy(), a.astype(np.float32))


def test_half_arithmetic_rounds_each_result(device):
    a = np.array([0.1, 1000.0, 3.3, -2.7], dtype=np.float16)
    b = np.array([0.2, 0.5, 1e-3, 1.1], dtype=np.float16)
    got = (plait.tensor(a, device=device) + plait.tensor(b, device=device)).numpy()
    np.testing.assert_array_equal(got, (a.astype(np.float32) + b.astype(np.float32)).astype(np.float16))
