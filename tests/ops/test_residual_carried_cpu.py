"""A cpu GEMM whose epilogue adds a residual takes the residual's storage for C (plan.Plan._carried): C holds the
residual on entry, the product is added to it and the epilogue drops the residual's term. Checked against PyTorch
on residual blocks (one k block and several, fringe columns, merged images, a downsampling block whose shortcut
has a batch norm of its own), and checked not to happen where the
residual is read again later, is a plan input, is the GEMM's own operand, or is kept for a backward pass."""

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand

TF = torch.nn.functional


def _block(x, w0, w1, w, b, conv, relu):
    """r = relu(conv1x1(x)); y = relu(conv1x1(relu(conv1x1(r)), w) + b + r); conv1x1(y): the residual `r` is read
    last by the product that adds it, and the block's output is not the plan's output."""
    r = relu(conv(x, w0))
    y = relu(conv(relu(conv(r, w1)), w, b) + r)
    return conv(y, w1)


def _weights(cin: int, cout: int) -> list[np.ndarray]:
    down, up = np.float32(1 / np.sqrt(cin)), np.float32(1 / np.sqrt(cout))  # values of order 1 at any k
    return [
        rand((cout, cin, 1, 1), seed=1) * down,
        rand((cin, cout, 1, 1), seed=2) * up,
        rand((cout, cin, 1, 1), seed=3) * down,
        rand((cout,), seed=4),
    ]


def _torch_block(x: np.ndarray, ws: list[np.ndarray]) -> np.ndarray:
    w0, w1, w, b = (torch.from_numpy(a) for a in ws)
    return _block(torch.from_numpy(x), w0, w1, w, b, TF.conv2d, torch.relu).numpy()


def _carried(plan: Plan) -> list[int]:
    """The steps whose GEMM carries its residual in C; each must share its residual's memory slot."""
    at = {it.out.uid: i for i, it in enumerate(plan.items)}
    steps = [i for i, it in enumerate(plan.items) if "carried" in it.extra]
    for i in steps:
        j = at[plan.items[i].extra["carried"].uid]
        assert plan.memory.slot[i] is not None and plan.memory.slot[i] == plan.memory.slot[j], (i, j)
    return steps


@pytest.mark.parametrize(
    "batch,cin,cout,hw",
    [
        (1, 16, 64, 23),  # one image, 529 columns: a fringe column past the last whole panel
        (2, 16, 64, 23),  # two images, one k block
        (2, 300, 64, 23),  # k = 300: two k blocks, the first one adding to the residual
        (3, 20, 32, 8),  # narrow images merged into one product (tiles spanning images)
    ],
)
def test_carried_residual_matches_torch(batch, cin, cout, hw):
    x, ws = rand((batch, cin, hw, hw)), _weights(cin, cout)
    w0, w1, w, b = (plait.tensor(a, device="cpu") for a in ws)
    f = plait.jit(lambda t: _block(t, w0, w1, w, b, F.conv2d, lambda v: v.relu()), device="cpu")
    out = np.asarray(f(x))
    assert len(_carried(f.plan_for([x])[0])) == 1
    assert_close(out, _torch_block(x, ws), "float32", f"residual block {batch}x{cin}x{hw}x{hw} -> {cout}")
    assert_close(np.asarray(f(x * 2)), _torch_block(x * 2, ws), "float32", "the same plan replayed on new input")


def test_residual_read_again_is_not_carried():
    """The residual is added once more after the GEMM: C must not overwrite it."""
    x, ws = rand((2, 16, 23, 23)), _weights(16, 64)
    w0, w1, w, b = (plait.tensor(a, device="cpu") for a in ws)

    def block(t):
        r = F.conv2d(t, w0).relu()
        y = (F.conv2d(F.conv2d(r, w1).relu(), w, b) + r).relu()
        return F.conv2d(y * r, w1)

    f = plait.jit(block, device="cpu")
    out = np.asarray(f(x))
    assert _carried(f.plan_for([x])[0]) == []
    tw0, tw1, tw, tb = (torch.from_numpy(a) for a in ws)
    r = TF.conv2d(torch.from_numpy(x), tw0).relu()
    y = (TF.conv2d(TF.conv2d(r, tw1).relu(), tw, tb) + r).relu()
    assert_close(out, TF.conv2d(y * r, tw1).numpy(), "float32", "residual read after the block")


def test_residual_plan_input_or_operand_is_not_carried():
    """A residual that is a plan input (the caller's buffer), and one that is also the GEMM's own B operand."""
    x, r, ws = rand((2, 64, 23, 23)), rand((2, 64, 23, 23), seed=5), _weights(64, 64)
    w0, w1, w, b = (plait.tensor(a, device="cpu") for a in ws)
    f = plait.jit(lambda t, s: F.conv2d((F.conv2d(t, w, b) + s).relu(), w1), device="cpu")
    out = np.asarray(f(x, r))
    assert _carried(f.plan_for([x, r])[0]) == []
    tw1, tw, tb = (torch.from_numpy(a) for a in ws[1:])
    want = TF.conv2d((TF.conv2d(torch.from_numpy(x), tw, tb) + torch.from_numpy(r)).relu(), tw1)
    assert_close(out, want.numpy(), "float32", "residual as a plan input")

    def own(t):
        s = F.conv2d(t, w0).relu()
        return F.conv2d((F.conv2d(s, w, b) + s).relu(), w1)

    g = plait.jit(own, device="cpu")
    out = np.asarray(g(x))
    assert _carried(g.plan_for([x])[0]) == []
    s = TF.conv2d(torch.from_numpy(x), torch.from_numpy(ws[0])).relu()
    want = TF.conv2d((TF.conv2d(s, tw, tb) + s).relu(), tw1)
    assert_close(out, want.numpy(), "float32", "residual that is also the product's operand")


def test_training_residual_block_is_not_carried():
    """Forward and backward through a residual block (realize's plans, whose kernels a recipe replays under other
    pinned sets): gradients against PyTorch, and no realize plan carries a residual in C."""
    x, ws = rand((2, 16, 23, 23)), _weights(16, 64)
    params = [plait.tensor(a, device="cpu", requires_grad=True) for a in ws]
    xp = plait.tensor(x, device="cpu")
    r = F.conv2d(xp, params[0]).relu()
    y = (F.conv2d(F.conv2d(r, params[1]).relu(), params[2], params[3]) + r).relu()
    assert _carried(Plan([y.node])) == []
    y.sum().backward()
    tp = [torch.tensor(a, requires_grad=True) for a in ws]
    tr = TF.conv2d(torch.from_numpy(x), tp[0]).relu()
    (TF.conv2d(TF.conv2d(tr, tp[1]).relu(), tp[2], tp[3]) + tr).relu().sum().backward()
    for p, t, name in zip(params, tp, ("w0", "w1", "w", "b"), strict=True):
        assert p.grad is not None and t.grad is not None
        assert_close(p.grad.numpy(), t.grad.numpy(), "float32", f"gradient of {name}", tol_scale=10)


@pytest.mark.parametrize("batch,hw", [(1, 23), (3, 8)])
def test_carried_residual_with_row_scale_matches_torch(batch, hw):
    """relu(conv1x1(h) * s + t + r), an unfolded batch norm's scale s per output channel (some of it zero, as a
    zero-initialised last gamma of a block): the micro-kernel scales the product's rows before adding them to C."""
    cin, cout = 24, 64
    x, ws = rand((batch, cin, hw, hw)), _weights(cin, cout)
    s, t = rand((cout,), seed=6), rand((cout,), seed=7)
    s[::5] = 0.0
    w0, w1, w, sp, tp = (plait.tensor(a, device="cpu") for a in (*ws[:3], s, t))

    def block(v):
        r = F.conv2d(v, w0).relu()
        h = F.conv2d(r, w1).relu()
        y = (F.conv2d(h, w) * sp.reshape(1, cout, 1, 1) + tp.reshape(1, cout, 1, 1) + r).relu()
        return F.conv2d(y, w1)

    f = plait.jit(block, device="cpu")
    out = np.asarray(f(x))
    plan = f.plan_for([x])[0]
    assert len(_carried(plan)) == 1
    tw0, tw1, tw, ts, tt = (torch.from_numpy(a) for a in (ws[0], ws[1], ws[2], s, t))
    r = TF.conv2d(torch.from_numpy(x), tw0).relu()
    h = TF.conv2d(r, tw1).relu()
    y = (TF.conv2d(h, tw) * ts.reshape(1, cout, 1, 1) + tt.reshape(1, cout, 1, 1) + r).relu()
    assert_close(out, TF.conv2d(y, tw1).numpy(), "float32", f"scaled residual block b{batch} {hw}x{hw}")


@pytest.mark.parametrize("stride", [1, 2])
def test_shortcut_with_its_own_batch_norm_is_carried(stride):
    """resnet's downsampling block at inference, relu(bn(conv1x1(r)) + bn_s(conv1x1_s(x))): the shortcut's batch norm
    is stored by the shortcut's own product (scheduler._branch_affines), and the main product carries it in C
    instead of reading the shortcut's raw product beside C and scaling it in the epilogue."""
    x, ws = rand((2, 16, 23, 23)), _weights(16, 64)
    ws_s = rand((64, 16, 1, 1), seed=6) * np.float32(0.25)
    stats = [rand((64,), seed=s, low=lo, high=hi) for s, lo, hi in ((7, -1, 1), (8, 0.5, 2), (9, 0.5, 2), (10, -1, 1))]
    pw = [plait.tensor(a, device="cpu") for a in (*ws, ws_s, *stats)]
    tw = [torch.from_numpy(a) for a in (*ws, ws_s, *stats)]

    def block(t, p, conv, bn, relu):
        w0, w1, _, _, w_s, mean, var, gamma, beta = p
        r = relu(conv(t, w0, None, stride))
        main = bn(conv(relu(conv(r, w1, None, 1)), w0, None, 1), mean, var, gamma, beta)
        short = bn(conv(t, w_s, None, stride), var - 0.25, mean.abs() + 0.5, beta, gamma)
        return conv(relu(main + short), w1, None, 1)  # (the block's output is not the plan's: it can share storage)

    def pbn(v, mean, var, gamma, beta):
        return F.batch_norm(v, mean, var, gamma, beta, training=False)

    def tbn(v, mean, var, gamma, beta):
        return TF.batch_norm(v, mean, var, gamma, beta, training=False)

    f = plait.jit(lambda t: block(t, pw, F.conv2d, pbn, lambda v: v.relu()), device="cpu")
    out = np.asarray(f(x))
    want = block(torch.from_numpy(x), tw, TF.conv2d, tbn, torch.relu).numpy()
    assert_close(out, want, "float32", f"downsampling block with a batch norm on both branches, stride {stride}")
    assert len(_carried(f.plan_for([x])[0])) == 1
