import numpy as np

import plait
from tests.helpers import check_op


def test_add_broadcast(device):
    check_op(lambda x, y: x + y, [(3, 4), (4,)], device)


def test_matmul(device):
    check_op(lambda x, y: x @ y, [(2, 5, 7), (7, 3)], device)


def test_softmax_like(device):
    def f(x):
        e = (x - x.max(axis=-1, keepdims=True)).exp()
        return e / e.sum(axis=-1, keepdims=True)

    def t(x):
        return x.softmax(-1)

    check_op(f, [(4, 9)], device, torch_fn=t)


def test_numpy_roundtrip(device):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(plait.tensor(a, device=device).numpy(), a)
