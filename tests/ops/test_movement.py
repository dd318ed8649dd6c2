"""Movement ops are views: reshape, permute, transpose, expand, pad, slicing (negative steps too), cat, flip."""

import numpy as np
import pytest

import plait
from tests.helpers import assert_close, rand

A = rand((3, 4, 5), "float32", seed=1)

VIEWS = {
    "reshape": (lambda t: t.reshape(4, 15), lambda a: a.reshape(4, 15)),
    "reshape -1": (lambda t: t.reshape(-1, 6), lambda a: a.reshape(-1, 6)),
    "flatten": (lambda t: t.flatten(1), lambda a: a.reshape(3, 20)),
    "permute": (lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
    "transpose": (lambda t: t.transpose(0, 2), lambda a: a.swapaxes(0, 2)),
    "T": (lambda t: t.T, lambda a: a.T),
    "expand": (lambda t: t[:, :1].expand(2, 3, 4, 5), lambda a: np.broadcast_to(a[:, :1], (2, 3, 4, 5))),
    "unsqueeze/squeeze": (lambda t: t.unsqueeze(1).squeeze(1), lambda a: a),
    "pad": (
        lambda t: t.pad(((1, 0), (0, 2), (3, 1)), 7.0),
        lambda a: np.pad(a, ((1, 0), (0, 2), (3, 1)), constant_values=7),
    ),
    "pad crop": (lambda t: t.pad(((-1, 1), (0, -2), (0, 0))), lambda a: np.pad(a[1:, :-2], ((0, 1), (0, 0), (0, 0)))),
    "slice": (lambda t: t[1:, ::2, 1:4], lambda a: a[1:, ::2, 1:4]),
    "negative steps": (lambda t: t[::-1, 3:0:-2, ::-3], lambda a: a[::-1, 3:0:-2, ::-3]),
    "negative bounds": (lambda t: t[-1:-4:-2, -2:], lambda a: a[-1:-4:-2, -2:]),
    "int index": (lambda t: t[-1, 2], lambda a: a[-1, 2]),
    "ellipsis/None": (lambda t: t[..., None, 1:3], lambda a: a[..., None, 1:3]),
    "ellipsis mid": (lambda t: t[1, ..., ::-1], lambda a: a[1, ..., ::-1]),
    "flip": (lambda t: t.flip((0, 2)), lambda a: np.flip(a, (0, 2))),
    "flip all": (lambda t: t.flip(), lambda a: np.flip(a)),
    "empty slice": (lambda t: t[2:1], lambda a: a[2:1]),
    "chain": (
        lambda t: t.permute(1, 0, 2)[::-1].reshape(12, 5)[1::3].pad(((0, 1), (1, 0))).T,
        lambda a: np.pad(a.transpose(1, 0, 2)[::-1].reshape(12, 5)[1::3], ((0, 1), (1, 0))).T,
    ),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view(device, name):
    f, ref = VIEWS[name]
    got = f(plait.tensor(A, device=device))
    want = ref(A)
    assert got.shape == want.shape
    assert_close(got.numpy(), want, "float32", f"{name} on {device}")


def test_views_of_int_and_bool(device):
    a = rand((4, 6), "int64", seed=2)
    b = rand((4, 6), "bool", seed=3)
    ta, tb = plait.tensor(a, device=device), plait.tensor(b, device=device)
    np.testing.assert_array_equal(
        ta.T[::-2].pad(((1, 1), (0, 0)), 9).numpy(), np.pad(a.T[::-2], ((1, 1), (0, 0)), constant_values=9)
    )
    np.testing.assert_array_equal(tb[:, ::-1].reshape(3, 8).numpy(), b[:, ::-1].reshape(3, 8))


def test_cat_and_stack(device):
    a, b, c = rand((2, 3), seed=4), rand((2, 1), seed=5), rand((2, 0), seed=6)
    i = rand((2, 2), "int32", seed=7)
    ta, tb, tc, ti = (plait.tensor(v, device=device) for v in (a, b, c, i))
    assert_close(plait.cat([ta, tb, tc, ta], axis=1).numpy(), np.concatenate([a, b, c, a], axis=1), "float32", "cat")
    assert_close(plait.cat([ta, tb], axis=-1).numpy(), np.concatenate([a, b], axis=-1), "float32", "cat -1")
    assert_close(plait.cat([ta.T, tb.T]).numpy(), np.concatenate([a.T, b.T]), "float32", "cat views")
    mixed = plait.cat([ta, ti], axis=1)
    assert mixed.dtype is plait.float32
    assert_close(mixed.numpy(), np.concatenate([a, i], axis=1).astype(np.float32), "float32", "cat mixed dtypes")
    assert_close(plait.stack([ta, ta * 2], axis=1).numpy(), np.stack([a, a * 2], axis=1), "float32", "stack")
    assert plait.cat([tc, tc], axis=1).numpy().shape == (2, 0)
    with pytest.raises(plait.ShapeError, match="cat"):
        plait.cat([ta, plait.tensor(rand((3, 0)), device=device)], axis=1)


def test_split_and_getitem_of_views(device):
    a = rand((7, 4), seed=8)
    parts = plait.tensor(a, device=device).split([2, 5])
    for got, want in zip(parts, np.split(a, [2]), strict=True):
        assert_close(got.numpy(), want, "float32", "split")
    assert_close(plait.tensor(a, device=device).split(3, axis=0)[-1].numpy(), a[6:], "float32", "split int")


def test_realize_then_view_then_compute(device):
    a = rand((4, 5), seed=9)
    t = (plait.tensor(a, device=device) * 2).realize()
    v = t[1:, ::-1].T
    assert_close(v.numpy(), (a * 2)[1:, ::-1].T, "float32", "view of a realized tensor")
    assert_close((v + 1).sum(axis=0).numpy(), ((a * 2)[1:, ::-1].T + 1).sum(axis=0), "float32", "compute on a view")
