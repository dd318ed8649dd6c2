"""Elementwise ops against NumPy on every device. Many ops are stacked into one output so one kernel checks them
all (each distinct kernel costs a compile); every slice is compared on its own."""

import numpy as np
import pytest

import plait
from tests.helpers import assert_close, rand

FLOAT_UNARY = {
    "neg": (lambda t: -t, lambda a: -a),
    "exp": (lambda t: t.exp(), np.exp),
    "log": (lambda t: t.abs().log(), lambda a: np.log(np.abs(a))),
    "sqrt": (lambda t: t.abs().sqrt(), lambda a: np.sqrt(np.abs(a))),
    "abs": (lambda t: t.abs(), np.abs),
    "relu": (lambda t: t.relu(), lambda a: np.maximum(a, 0)),
    "sigmoid": (lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a))),
    "tanh": (lambda t: t.tanh(), np.tanh),
}
BINARY = {
    "add": (lambda x, y: x + y, np.add),
    "sub": (lambda x, y: x - y, np.subtract),
    "mul": (lambda x, y: x * y, np.multiply),
    "div": (lambda x, y: x / y, np.true_divide),
    "maximum": (lambda x, y: x.maximum(y), np.maximum),
    "minimum": (lambda x, y: plait.minimum(x, y), np.minimum),
}
COMPARE = {
    "lt": (lambda x, y: x < y, np.less),
    "le": (lambda x, y: x <= y, np.less_equal),
    "gt": (lambda x, y: x > y, np.greater),
    "ge": (lambda x, y: x >= y, np.greater_equal),
    "eq": (lambda x, y: x == y, np.equal),
    "ne": (lambda x, y: x != y, np.not_equal),
}


def _check_stacked(outs, refs, dtype, device):
    got = plait.stack(outs).numpy()
    for i, (name, ref) in enumerate(refs.items()):
        assert_close(got[i], np.asarray(ref), dtype, f"{name} on {device}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_float_unary(device, dtype):
    a = rand((3, 5), dtype, seed=1)
    t = plait.tensor(a, device=device)
    outs = [f(t) for f, _ in FLOAT_UNARY.values()]
    refs = {n: ref(a.astype(np.float32)).astype(dtype) for n, (_, ref) in FLOAT_UNARY.items()}
    assert all(o.dtype.name == dtype for o in outs)
    _check_stacked(outs, refs, dtype, device)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64"])
def test_binary_with_broadcasting(device, dtype):
    a = rand((2, 3, 4), dtype, seed=1)
    b = rand((3, 1), dtype, seed=2)
    b = np.where(b == 0, 3, b).astype(dtype)  # no division by zero
    x, y = plait.tensor(a, device=device), plait.tensor(b, device=device)
    outs = [f(x, y).astype("float32") for f, _ in BINARY.values()]
    refs = {n: ref(a, b).astype("float32") for n, (_, ref) in BINARY.items()}
    tol = "float16" if dtype == "float16" else "float32"
    _check_stacked(outs, refs, tol, device)
    for f, ref in BINARY.values():
        want = ref(a, b)
        assert f(x, y).dtype.name == ("float32" if want.dtype == np.float64 else str(want.dtype))


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_comparisons(device, dtype):
    a = rand((4, 5), dtype, seed=3)
    b = a[::-1].copy()  # some equal elements
    x, y = plait.tensor(a, device=device), plait.tensor(b, device=device)
    outs = [f(x, y) for f, _ in COMPARE.values()] + [x < 0.5, 1 >= x]
    refs = {n: ref(a, b) for n, (_, ref) in COMPARE.items()} | {"lt scalar": a < 0.5, "rge scalar": 1 >= a}
    assert all(o.dtype is plait.bool_ for o in outs)
    _check_stacked(outs, refs, "bool", device)


def test_scalars_and_reflected_operators(device):
    a = rand((6,), "float32", seed=4, low=0.5, high=2)
    x = plait.tensor(a, device=device)
    f32 = np.float32
    outs = [x + 1, 1 + x, x - 2.5, 2.5 - x, x * 3, 3 * x, x / 4, 4 / x, x**2, 2**x, -x + 0.5, (x * 2).clip(1, 3)]
    refs = [a + 1, 1 + a, a - f32(2.5), f32(2.5) - a, a * 3, 3 * a, a / 4, 4 / a, a**2, f32(2) ** a, -a + f32(0.5)]
    refs.append(np.clip(a * 2, 1, 3))
    _check_stacked(outs, {str(i): r for i, r in enumerate(refs)}, "float32", device)


def test_pow(device):
    a = rand((8,), "float32", seed=5, low=0.1, high=3)
    b = rand((8,), "float32", seed=6, low=-2, high=2)
    got = (plait.tensor(a, device=device) ** plait.tensor(b, device=device)).numpy()
    assert_close(got, a**b, "float32", f"pow on {device}")


def test_integer_arithmetic(device):
    a = np.array([-7, -3, 0, 2, 5, 9, 2**20, -(2**20)], dtype=np.int32)
    b = np.array([2, -3, 5, 3, 1, -4, 3, 7], dtype=np.int32)
    e = np.array([0, 1, 2, 3, 2, 1, 1, 1], dtype=np.int32)
    x, y, k = (plait.tensor(v, device=device) for v in (a, b, e))
    outs = [x + y, x - y, x * y, x % y, -x, x.abs(), x.relu(), x.maximum(y), x**k, x % 4, x * 3]
    refs = [a + b, a - b, a * b, a % b, -a, np.abs(a), np.maximum(a, 0), np.maximum(a, b), a**e, a % 4, a * 3]
    for o, r in zip(outs, refs, strict=True):
        assert o.dtype.name == str(r.dtype) == "int32"
    _check_stacked(outs, {str(i): r for i, r in enumerate(refs)}, "int32", device)
    q = (x / y).numpy()  # true division of integers gives float32 (PyTorch)
    assert q.dtype == np.float32
    assert_close(q, (a / b).astype(np.float32), "float32", "int true division")


def test_int64_large_values_and_wraparound(device):
    a = np.array([2**40, -(2**40) + 3, 2**62, 7], dtype=np.int64)
    x = plait.tensor(a, device=device)
    got = plait.stack([x + 1, x * 2, x - a[::-1].copy(), x**2]).numpy()
    with np.errstate(over="ignore"):
        want = np.stack([a + 1, a * 2, a - a[::-1], a**2])
    np.testing.assert_array_equal(got, want)


def test_float_modulo_follows_the_divisor_sign(device):
    a = np.array([-2.5, -1.0, 0.0, 1.25, 3.5, -0.2], dtype=np.float32)
    b = np.array([0.7, -0.7, 2.0, -1.0, 1.5, 3.0], dtype=np.float32)
    got = (plait.tensor(a, device=device) % plait.tensor(b, device=device)).numpy()
    assert_close(got, np.mod(a, b), "float32", "float mod")


def test_bool_logic_and_integer_bitwise(device):
    p = np.array([True, True, False, False])
    q = np.array([True, False, True, False])
    i = np.array([0b1100, -1, 7, 0], dtype=np.int32)
    j = np.array([0b1010, 5, -8, 3], dtype=np.int32)
    tp, tq, ti, tj = (plait.tensor(v, device=device) for v in (p, q, i, j))
    bools = plait.stack([tp & tq, tp | tq, tp ^ tq, ~tp, tp & True, tp.logical_not()]).numpy()
    np.testing.assert_array_equal(bools, np.stack([p & q, p | q, p ^ q, ~p, p & True, ~p]))
    ints = plait.stack([ti & tj, ti | tj, ti ^ tj, ~ti]).numpy()
    np.testing.assert_array_equal(ints, np.stack([i & j, i | j, i ^ j, ~i]))


def test_where_broadcasts_and_promotes(device):
    c = rand((3, 1), "bool", seed=7)
    a = rand((1, 4), "float32", seed=8)
    b = rand((3, 4), "int32", seed=9)
    tc, ta, tb = (plait.tensor(v, device=device) for v in (c, a, b))
    got = plait.where(tc, ta, tb)
    assert got.dtype is plait.float32
    assert_close(got.numpy(), np.where(c, a, b).astype(np.float32), "float32", "where")
    got2 = plait.where(tc, 1, 0)  # two Python ints: int64 like torch.where
    assert got2.dtype is plait.int64
    np.testing.assert_array_equal(got2.numpy(), np.where(c, 1, 0))
    got3 = (tb > 0).where(tb, 2.5)
    assert_close(got3.numpy(), np.where(b > 0, b, 2.5).astype(np.float32), "float32", "where scalar")


def test_nan_propagates_through_maximum_and_minimum(device):
    a = np.array([1.0, np.nan, 2.0, np.nan], dtype=np.float32)
    b = np.array([np.nan, 1.0, 0.0, np.nan], dtype=np.float32)
    x, y = plait.tensor(a, device=device), plait.tensor(b, device=device)
    got = plait.stack([x.maximum(y), x.minimum(y)]).numpy()
    np.testing.assert_array_equal(got, np.stack([np.maximum(a, b), np.minimum(a, b)]))


def test_nan_propagates_through_relu(device):
    """relu keeps NaN (as torch.relu and np.maximum(x, 0) do) on its own and as a GEMM's fused epilogue."""
    a = np.array([np.nan, -1.0, 2.0, np.inf, -np.inf, 0.5], dtype=np.float32)
    np.testing.assert_array_equal(plait.tensor(a, device=device).relu().numpy(), np.maximum(a, 0))
    m = np.array([[1.0, np.nan], [0.5, -2.0]], dtype=np.float32)
    w = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    got = (plait.tensor(m, device=device) @ plait.tensor(w, device=device)).relu().numpy()
    np.testing.assert_array_equal(got, np.maximum(m @ w, 0))


def test_nan_propagates_through_relu6(device):
    """relu6 (hardtanh) keeps NaN, as torch does, and clamps the infinities."""
    a = np.array([np.nan, -1.0, 0.0, 2.0, 6.0, 7.0, np.inf, -np.inf], dtype=np.float32)
    got = plait.nn.functional.relu6(plait.tensor(a, device=device)).numpy()
    np.testing.assert_array_equal(got, np.clip(a, 0, 6))


def test_zero_size_and_zero_dim(device):
    e = plait.tensor(np.zeros((0, 3), np.float32), device=device)
    assert (e + 1).numpy().shape == (0, 3)
    s = plait.tensor(np.float32(2.5), device=device)
    a = rand((2, 2), "float32", seed=10)
    assert_close((s * plait.tensor(a, device=device)).numpy(), 2.5 * a, "float32", "0-d broadcast")
    assert (s + 1).item() == 3.5


@pytest.mark.parametrize(("n", "c", "h", "w"), [(3, 5, 6, 7), (2, 4, 16, 16), (4, 3, 1, 40)])
def test_channel_major_view_of_nchw_rows_split_per_image(device, n, c, h, w):
    """An elementwise kernel over a channel-major view (C, N*H*W) of an NCHW tensor, beside an operand stored in that
    view's order and a per-channel one (a batch-norm gradient's shape): on the cpu the row loop runs over each image's
    H*W positions (cstyle._row_split), so the NCHW operand's row is a contiguous run, not positions divided out of the
    flat index; the values match NumPy on every device."""
    x = rand((n, c, h, w), seed=1)
    y = rand((c, n * h * w), seed=2)
    s = rand((c, 1), seed=3)
    xt, yt, st = (plait.tensor(a, device=device) for a in (x, y, s))
    f = plait.jit(lambda a, b, k: (a.permute(1, 0, 2, 3).reshape(c, n * h * w) - b * k) * k, device=device)
    want = (x.transpose(1, 0, 2, 3).reshape(c, n * h * w) - y * s) * s
    assert_close(np.asarray(f(xt, yt, st)), want, "float32", "channel-major view", tol_scale=4)
    if device == "cpu" and h * w >= 16:
        plan, _ = f.plan_for([x, y, s])
        src = next(k.source for k in plan.kernels if k.name.startswith("E_"))
        assert f"j < {h * w};" in src, src
