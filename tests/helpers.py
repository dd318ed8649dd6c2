"""One helper to check an op forward and backward against PyTorch (or NumPy) on a device.

    check_op(lambda x, y: x * y, [(3, 4), (4,)], device)                  # same function, both frameworks
    check_op(lambda x: x.relu(), [(5,)], device, torch_fn=torch.relu)      # a different spelling in torch

Inputs are random arrays of the given shapes (or the arrays themselves). Forward outputs and, for float inputs,
gradients of sum(out * random weights) are compared with a per-dtype tolerance from TOLERANCE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import plait

TOLERANCE = {  # dtype -> (rtol, atol)
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-2),
    "int32": (0, 0),
    "int64": (0, 0),
    "bool": (0, 0),
}


def rand(
    shape: Sequence[int], dtype: str = "float32", seed: int = 0, low: float = -2.0, high: float = 2.0
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if dtype.startswith("int"):
        return rng.integers(int(low) * 5, int(high) * 5 + 1, size=shape).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str, tol_scale: float = 1.0) -> None:
    rtol, atol = TOLERANCE[dtype]
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != reference {want.shape}"
    if dtype in ("int32", "int64", "bool"):
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=rtol * tol_scale, atol=atol * tol_scale, err_msg=what
        )


def check_op(
    fn: Callable[..., Any],
    inputs: Sequence[Sequence[int] | np.ndarray],
    device: str,
    torch_fn: Callable[..., Any] | None = None,
    dtype: str = "float32",
    grad: bool = True,
    tol_scale: float = 1.0,
    low: float = -2.0,
    high: float = 2.0,
) -> None:
    arrays = [
        x if isinstance(x, np.ndarray) else rand(x, dtype, seed=i, low=low, high=high) for i, x in enumerate(inputs)
    ]
    floats = [a.dtype.kind == "f" for a in arrays]
    ts = [plait.tensor(a, device=device, requires_grad=grad and f) for a, f in zip(arrays, floats)]
    tt = [torch.tensor(a, requires_grad=grad and f) for a, f in zip(arrays, floats)]
    out = fn(*ts)
    ref = (torch_fn or fn)(*tt)
    outs, refs = (list(out), list(ref)) if isinstance(out, (list, tuple)) else ([out], [ref])
    out_dtype = str(refs[0].dtype).replace("torch.", "")
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert_close(
            o.numpy(),
            r.detach().numpy(),
            out_dtype if out_dtype in TOLERANCE else dtype,
            f"forward output {i} on {device}",
            tol_scale,
        )
    if not (grad and any(floats) and refs[0].dtype.is_floating_point):
        return
    weights = [rand(r.shape, "float32", seed=100 + i) for i, r in enumerate(refs)]
    loss_p = None
    loss_t = None
    for o, r, w in zip(outs, refs, weights):
        lp = (o * plait.tensor(w, device=device)).sum()
        lt = (r * torch.tensor(w)).sum()
        loss_p = lp if loss_p is None else loss_p + lp
        loss_t = lt if loss_t is None else loss_t + lt
    assert loss_p is not None and loss_t is not None
    loss_p.backward()
    loss_t.backward()
    for i, (p, t) in enumerate(zip(ts, tt)):
        if t.grad is None:
            continue
        assert p.grad is not None, f"input {i} got no gradient on {device}"
        assert_close(p.grad.numpy(), t.grad.numpy(), dtype, f"gradient of input {i} on {device}", tol_scale * 10)


def run_gemm_kernel(device: str, kern: Any, batch: int, m: int, n: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Run one rendered GEMM kernel (arguments C, A, B) on `device` with host operands; C as (batch, m, n)."""
    from plait.runtime import get_device

    dev = get_device(device)
    al = dev.allocator
    bufs = [al.alloc(4 * batch * m * n), al.alloc(a.nbytes), al.alloc(b.nbytes)]
    al.copy_in(bufs[1], a)
    al.copy_in(bufs[2], b)
    dev.compile(kern.source, kern.name).bind(bufs, kern.global_size, kern.local_size)()
    out = np.empty((batch, m, n), np.float32)
    al.copy_out(bufs[0], out)
    for buf in bufs:
        al.free(buf.nbytes, buf.handle)
    return out


def check_batch_norm_training(device: str, shape: tuple[int, ...]) -> None:
    """Training-mode batch norm (relu after, squared loss) on `device`: the output and the gradients of x, weight and
    bias against PyTorch in float64."""
    import plait.nn.functional as F
    from plait.graph import autodiff

    c = shape[1]
    xs, ws, bs = rand(shape, seed=1), rand((c,), seed=2), rand((c,), seed=3)
    x = plait.tensor(xs, device=device, requires_grad=True)
    w = plait.tensor(ws, device=device, requires_grad=True)
    b = plait.tensor(bs, device=device, requires_grad=True)
    y = F.relu(F.batch_norm(x, None, None, w, b, training=True))
    loss = (y * y).sum()
    seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=device).node
    g = autodiff.gradients(loss.node, seed, [x.node, w.node, b.node])
    got = [plait.Tensor(g[t.node.uid]).numpy() for t in (x, w, b)]
    ref = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in (xs, ws, bs)]
    yr = torch.relu(torch.nn.functional.batch_norm(ref[0], None, None, ref[1], ref[2], True))
    (yr * yr).sum().backward()
    assert_close(y.numpy(), yr.detach().numpy(), "float32", "batch norm output", tol_scale=20)
    for name, have, want in zip(("x", "weight", "bias"), got, ref, strict=True):
        assert want.grad is not None
        assert_close(have, want.grad.numpy(), "float32", f"batch norm gradient of {name}", tol_scale=20)
