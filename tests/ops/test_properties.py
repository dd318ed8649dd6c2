"""Property tests on random shapes: broadcasting, reductions over random axes, and random chains of movement ops
(index arithmetic), each against NumPy. The number of examples is PLAIT_HYPOTHESIS_EXAMPLES (conftest profile)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, mutually_broadcastable_shapes

import plait
from tests.helpers import assert_close, rand

DIMS = {"min_dims": 0, "max_dims": 4, "min_side": 1, "max_side": 4}


@given(shapes=mutually_broadcastable_shapes(num_shapes=3, **DIMS), data=st.data())
def test_broadcasting(device, shapes, data):
    (sa, sb, sc), want_shape = shapes
    a, b = rand(sa, seed=1), rand(sb, seed=2)
    c = rand(sc, "bool", seed=3)
    ta, tb, tc = (plait.tensor(v, device=device) for v in (a, b, c))
    got = plait.where(tc, ta * tb, ta - tb)
    assert got.shape == want_shape
    assert_close(got.numpy(), np.where(c, a * b, a - b), "float32", f"{sa} {sb} {sc} on {device}")


@given(
    shape=array_shapes(min_dims=1, max_dims=4, max_side=5),
    op=st.sampled_from(["sum", "max", "min", "mean"]),
    keepdims=st.booleans(),
    data=st.data(),
)
def test_reductions(device, shape, op, keepdims, data):
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)), "axes")
    axis = tuple(axes) if axes else None
    a = rand(shape, seed=4)
    got = getattr(plait.tensor(a, device=device), op)(axis=axis, keepdims=keepdims)
    want = getattr(np, op)(a, axis=axis, keepdims=keepdims)
    assert_close(got.numpy(), want, "float32", f"{op} {shape} axis={axis} keepdims={keepdims} on {device}")


@st.composite
def movement_chain(draw, shape):
    """A list of (name, arg) steps valid for `shape` applied in order."""
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["permute", "slice", "flip", "pad", "reshape", "expand"]))
        if kind == "permute":
            arg = tuple(draw(st.permutations(range(len(shape)))))
            shape = tuple(shape[p] for p in arg)
        elif kind == "slice":
            arg = []
            for s in shape:
                step = draw(st.sampled_from([1, 2, -1, -2, 3]))
                lo, hi = sorted(draw(st.tuples(st.integers(-s, s), st.integers(-s, s))))
                arg.append(slice(lo, hi, step) if step > 0 else slice(hi, lo, step))
            arg = tuple(arg)
            shape = np.empty(shape)[arg].shape
        elif kind == "flip":
            arg = tuple(draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1)))
        elif kind == "pad":
            arg = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in shape)
            shape = tuple(s + a + b for s, (a, b) in zip(shape, arg, strict=True))
        elif kind == "reshape":
            n = int(np.prod(shape))
            divisors = [d for d in range(1, n + 1) if n % d == 0] or [0]
            d = draw(st.sampled_from(divisors))
            arg = (d, n // d if d else 0) if n else (0, *shape[1:])
            shape = arg
        else:
            arg = (2, *shape)
            shape = arg
        steps.append((kind, arg))
    return steps


def _apply(x, steps, is_np):
    for kind, arg in steps:
        if kind == "permute":
            x = x.transpose(arg) if is_np else x.permute(*arg)
        elif kind == "slice":
            x = x[arg]
        elif kind == "flip":
            x = np.flip(x, arg) if is_np else x.flip(arg)
        elif kind == "pad":
            x = np.pad(x, arg, constant_values=-1) if is_np else x.pad(arg, -1.0)
        elif kind == "reshape":
            x = x.reshape(arg)
        else:
            x = np.broadcast_to(x, arg) if is_np else x.expand(*arg)
    return x


@given(shape=array_shapes(min_dims=1, max_dims=3, max_side=4), data=st.data())
def test_movement_chains(device, shape, data):
    steps = data.draw(movement_chain(shape), "steps")
    a = rand(shape, seed=5)
    want = _apply(a, steps, True)
    got = _apply(plait.tensor(a, device=device), steps, False)
    assert got.shape == want.shape, steps
    assert_close((got * 1).numpy(), want, "float32", f"{shape} {steps} on {device}")
