"""The `cpu` device's fused inverted-residual block at inference (IRBLOCK, plait/codegen/irblock_c.py via
plait/schedule/irblock.py): expand 1x1 -> depthwise 3x3 -> project 1x1, each with a batch-norm-style epilogue (ReLU6
after the first two), with and without the residual add, stride 1 and 2, odd planes, at one, two and four threads
(wide planes split among threads by output rows, small ones by vectors of expanded channels: a thread's run
starting or ending inside a packed panel, 48 channels at 16-float vectors, a thread with no rows or no channels);
against PyTorch. Blocks without an expand product (the depthwise window on another kernel's output). And the rules
that keep the three kernels: weights passed per call (a training step's), an expanded
tensor someone else reads, expanded channels that are not whole panels."""

from collections.abc import Iterator

import numpy as np
import pytest
import torch

import plait
import plait.nn.functional as F
from plait.codegen import irblock_c
from plait.schedule.plan import read, run_launches
from tests.helpers import assert_close, rand
from tests.ops.conftest import omp_threads


@pytest.fixture(params=[1, 2, 4], ids=["1-thread", "2-threads", "4-threads"])
def team_size(request: pytest.FixtureRequest) -> Iterator[int]:
    """Regions opened from the test's thread (standalone kernels and team runs) use `request.param` threads."""
    with omp_threads(request.param) as n:
        yield n


def _weights(cin: int, c1: int, m2: int) -> list[np.ndarray]:
    ws = [
        rand((c1, cin, 1, 1), seed=1) / np.float32(cin**0.5),
        rand((c1, 1, 3, 3), seed=2) / np.float32(3.0),
        rand((m2, c1, 1, 1), seed=3) / np.float32(c1**0.5),
    ]
    return ws + [rand((c,), seed=10 + i) for i, c in enumerate((c1, c1, c1, c1, m2, m2))]


def _plait_block(ws: list[np.ndarray], stride: int, residual: bool) -> plait.jit:
    w1, wd, w2, s1, h1, s2, h2, s3, h3 = (plait.tensor(a, device="cpu") for a in ws)
    c1, m2 = ws[0].shape[0], ws[2].shape[0]

    def block(t: plait.Tensor) -> plait.Tensor:
        a = (F.conv2d(t, w1) * s1.reshape(c1, 1, 1) + h1.reshape(c1, 1, 1)).clip(0.0, 6.0)
        b = F.conv2d(a, wd, stride=stride, padding=1, groups=c1) * s2.reshape(c1, 1, 1) + h2.reshape(c1, 1, 1)
        y = F.conv2d(b.clip(0.0, 6.0), w2) * s3.reshape(m2, 1, 1) + h3.reshape(m2, 1, 1)
        return y + t if residual else y

    return plait.jit(block, "cpu")


def _torch_block(x: np.ndarray, ws: list[np.ndarray], stride: int, residual: bool) -> np.ndarray:
    w1, wd, w2, s1, h1, s2, h2, s3, h3 = (torch.tensor(a) for a in ws)
    c1, m2 = w1.shape[0], w2.shape[0]
    conv = torch.nn.functional.conv2d
    a = (conv(torch.tensor(x), w1) * s1.reshape(c1, 1, 1) + h1.reshape(c1, 1, 1)).clamp(0.0, 6.0)
    b = (conv(a, wd, stride=stride, padding=1, groups=c1) * s2.reshape(c1, 1, 1) + h2.reshape(c1, 1, 1)).clamp(0, 6)
    y = conv(b, w2) * s3.reshape(m2, 1, 1) + h3.reshape(m2, 1, 1)
    return (y + torch.tensor(x) if residual else y).numpy()


def _kinds(f: plait.jit, x: np.ndarray) -> list[str]:
    plan, _ = f.plan_for([x])
    return [k.name.split("_")[0] for k in plan.kernels]


def _check_runs(f: plait.jit, x: np.ndarray, kinds: list[str], ref: np.ndarray, what: str) -> None:
    """The plan of `f` for `x` runs kernels of `kinds` and gives `ref`: as a team run (twice: a replay reads the weights
    packed when the plan was built) and launched alone."""
    plan, _ = f.plan_for([x])
    assert [k.name.split("_")[0] for k in plan.kernels] == kinds
    for _ in range(2):
        assert_close(f(x), ref, "float32", what, tol_scale=10)
    run_launches(plan.device, plan.launches)
    assert_close(read(plan.device, plan.buffers[plan.outputs[0].uid], plan.outputs[0]), ref, "float32", what, 10)


CASES = [  # input channels, expanded channels, output channels, images and plane (n, height, width), stride, residual
    # planes over 49 pixels: threads split the output rows, each expanding its strip's border rows
    (16, 96, 16, (14, 14), 1, True),  # mobilenet_v2-like, two panels of 48
    (16, 96, 24, (14, 14), 2, False),  # stride 2 on an even plane
    (24, 144, 40, (13, 13), 2, False),  # stride 2 on an odd plane: the last strip's bottom border is the zero row
    (40, 192, 70, (11, 11), 2, False),  # 70 output channels: a partial vector and a partial panel
    (8, 96, 8, (52, 52), 1, True),  # strips short enough for all 96 channels (three; four at two and four threads)
    (16, 96, 24, (112, 112), 2, False),  # mobilenet_v2's 112x112 stride-2 block: seven strips, or eight (two threads)
    (8, 48, 8, (2, 400), 2, False),  # one output row: a second thread has no rows
    # planes of up to 49 pixels: threads split the expanded channels
    (24, 144, 24, (5, 5), 1, True),  # 25 pixels: a partial pixel tile in both products
    (24, 144, 32, (7, 7), 1, False),  # two threads split three panels 64:80, four 32:32:32:48
    (20, 48, 20, (6, 6), 1, True),  # one panel of three vectors: a fourth thread has no channels
    # several images: threads take whole images, or (more threads than images) strips of them
    (16, 96, 16, (3, 14, 14), 1, True),
    (24, 144, 40, (2, 7, 7), 2, False),  # small planes too go by images and rows
]


@pytest.mark.parametrize(("cin", "c1", "m2", "hw", "stride", "residual"), CASES)
def test_block_matches_torch(
    cin: int, c1: int, m2: int, hw: tuple[int, ...], stride: int, residual: bool, team_size: int
) -> None:
    """As a team run (twice: a replay reads the weights packed when the plan was built) and launched alone."""
    n, h, w = hw if len(hw) == 3 else (1, *hw)
    x, ws = rand((n, cin, h, w)), _weights(cin, c1, m2)
    f = _plait_block(ws, stride, residual)
    what = f"block {cin}->{c1}->{m2} {n}x{h}x{w} s{stride}, {team_size} threads"
    _check_runs(f, x, ["IRBLOCK"], _torch_block(x, ws, stride, residual), what)


def test_weights_passed_per_call_keep_three_kernels() -> None:
    """Weights that are arguments of the plan (a training step's parameters) are never packed once."""
    cin, c1, m2 = 16, 96, 16
    x, ws = rand((1, cin, 14, 14)), _weights(cin, c1, m2)

    def block(t: plait.Tensor, w1: plait.Tensor, wd: plait.Tensor, w2: plait.Tensor) -> plait.Tensor:
        a = F.conv2d(t, w1).clip(0.0, 6.0)
        return F.conv2d(F.conv2d(a, wd, padding=1, groups=c1).clip(0.0, 6.0), w2)

    f = plait.jit(block, "cpu")
    plan, _ = f.plan_for([x, *ws[:3]])
    assert "IRBLOCK" not in [k.name.split("_")[0] for k in plan.kernels]


def test_expanded_tensor_read_elsewhere_keeps_its_product() -> None:
    """An expanded tensor that is also an output must be made: its product stays a kernel of its own, and the
    depthwise window and the projection fuse as a block without an expand product."""
    cin, c1, m2 = 16, 96, 16
    x, ws = rand((1, cin, 14, 14)), _weights(cin, c1, m2)
    w1, wd, w2 = (plait.tensor(a, device="cpu") for a in ws[:3])

    def block(t: plait.Tensor) -> tuple[plait.Tensor, plait.Tensor]:
        a = F.conv2d(t, w1).clip(0.0, 6.0)
        return a, F.conv2d(F.conv2d(a, wd, padding=1, groups=c1).clip(0.0, 6.0), w2)

    f = plait.jit(block, "cpu")
    assert _kinds(f, x)[-1] == "IRBLOCK" and "IRBLOCK" not in _kinds(f, x)[:-1]
    a, y = f(x)
    conv = torch.nn.functional.conv2d
    ra = conv(torch.tensor(x), torch.tensor(ws[0])).clamp(0.0, 6.0)
    ry = conv(conv(ra, torch.tensor(ws[1]), padding=1, groups=c1).clamp(0.0, 6.0), torch.tensor(ws[2]))
    assert_close(a, ra.numpy(), "float32", "expanded tensor", tol_scale=10)
    assert_close(y, ry.numpy(), "float32", "unfused block", tol_scale=10)


def test_expanded_channels_not_in_whole_panels_keep_three_kernels() -> None:
    """The block's scratch holds whole panels of expanded channels: other counts keep the three kernels."""
    cin, c1, m2 = 16, 2 * irblock_c.GP + irblock_c.VW, 16  # whole vectors, not whole panels
    x, ws = rand((1, cin, 14, 14)), _weights(cin, c1, m2)
    f = _plait_block(ws, 1, True)
    assert "IRBLOCK" not in _kinds(f, x)
    assert_close(f(x), _torch_block(x, ws, 1, True), "float32", f"{c1} expanded channels", tol_scale=10)


def _plait_dw_block(ws: list[np.ndarray], stride: int, residual: bool) -> plait.jit:
    """A block without an expand product (mobilenet_v2's first): ReLU6 before it (another kernel's epilogue), then
    the depthwise window and the projection with their batch-norm-style epilogues."""
    wd, w2, s2, h2, s3, h3 = (plait.tensor(a, device="cpu") for a in ws)
    c1, m2 = ws[0].shape[0], ws[1].shape[0]

    def block(t: plait.Tensor) -> plait.Tensor:
        a = (t * 2.0).clip(0.0, 6.0)
        b = F.conv2d(a, wd, stride=stride, padding=1, groups=c1) * s2.reshape(c1, 1, 1) + h2.reshape(c1, 1, 1)
        y = F.conv2d(b.clip(0.0, 6.0), w2) * s3.reshape(m2, 1, 1) + h3.reshape(m2, 1, 1)
        return y + t if residual else y

    return plait.jit(block, "cpu")


def _torch_dw_block(x: np.ndarray, ws: list[np.ndarray], stride: int, residual: bool) -> np.ndarray:
    wd, w2, s2, h2, s3, h3 = (torch.tensor(a) for a in ws)
    c1, m2 = wd.shape[0], w2.shape[0]
    conv = torch.nn.functional.conv2d
    a = (torch.tensor(x) * 2.0).clamp(0.0, 6.0)
    b = (conv(a, wd, stride=stride, padding=1, groups=c1) * s2.reshape(c1, 1, 1) + h2.reshape(c1, 1, 1)).clamp(0, 6)
    y = conv(b, w2) * s3.reshape(m2, 1, 1) + h3.reshape(m2, 1, 1)
    return (y + torch.tensor(x) if residual else y).numpy()


DW_CASES = [  # channels, output channels, images and plane (n, height, width), stride, residual
    (48, 16, (2, 16, 16), 1, False),  # mobilenet_v2's first block's shape in small: two images, whole 8-pixel runs
    (48, 48, (13, 13), 1, True),  # odd rows: 8-pixel runs and a tail of 5 copied one by one
    (96, 24, (14, 14), 2, False),  # stride 2
    (48, 70, (2, 11, 9), 2, False),  # 70 outputs: a partial vector; 9-wide rows
    (96, 40, (60, 60), 1, False),  # two strips, each in chunks of channels
    (48, 8, (7, 7), 1, False),  # one image on a 7x7 plane: threads split the channels
]


@pytest.mark.parametrize(("c1", "m2", "hw", "stride", "residual"), DW_CASES)
def test_block_without_expand_matches_torch(
    c1: int, m2: int, hw: tuple[int, ...], stride: int, residual: bool, team_size: int
) -> None:
    """A depthwise window whose input no 1x1 product makes, with the projection that alone reads it, is one IRBLOCK
    that copies the input channels into its scratch: as a team run (twice) and launched alone."""
    n, h, w = hw if len(hw) == 3 else (1, *hw)
    ws = [
        rand((c1, 1, 3, 3), seed=2) / np.float32(3.0),
        rand((m2, c1, 1, 1), seed=3) / np.float32(c1**0.5),
        *(rand((c,), seed=10 + i) for i, c in enumerate((c1, c1, m2, m2))),
    ]
    x = rand((n, c1, h, w))
    f = _plait_dw_block(ws, stride, residual)
    what = f"block {c1}->{m2} {n}x{h}x{w} s{stride}, {team_size} threads"
    _check_runs(f, x, ["E", "IRBLOCK"], _torch_dw_block(x, ws, stride, residual), what)


def _stem_block(ws: list[np.ndarray], stem_stride: int, stride: int) -> plait.jit:
    """An image stem (3x3 convolution over few channels, padding 1, batch-norm-style epilogue and ReLU6), then a
    depthwise window and a projection: the stem stands in for the block's expand product."""
    w0, wd, w2, s1, h1, s2, h2, s3, h3 = (plait.tensor(a, device="cpu") for a in ws)
    c1, m2 = ws[0].shape[0], ws[2].shape[0]

    def block(t: plait.Tensor) -> plait.Tensor:
        a = (F.conv2d(t, w0, stride=stem_stride, padding=1) * s1.reshape(c1, 1, 1) + h1.reshape(c1, 1, 1)).clip(0, 6)
        b = F.conv2d(a, wd, stride=stride, padding=1, groups=c1) * s2.reshape(c1, 1, 1) + h2.reshape(c1, 1, 1)
        return F.conv2d(b.clip(0.0, 6.0), w2) * s3.reshape(m2, 1, 1) + h3.reshape(m2, 1, 1)

    return plait.jit(block, "cpu")


def _torch_stem_block(x: np.ndarray, ws: list[np.ndarray], stem_stride: int, stride: int) -> np.ndarray:
    w0, wd, w2, s1, h1, s2, h2, s3, h3 = (torch.tensor(a) for a in ws)
    c1, m2 = w0.shape[0], w2.shape[0]
    conv = torch.nn.functional.conv2d
    a = conv(torch.tensor(x), w0, stride=stem_stride, padding=1) * s1.reshape(c1, 1, 1) + h1.reshape(c1, 1, 1)
    b = conv(a.clamp(0, 6), wd, stride=stride, padding=1, groups=c1) * s2.reshape(c1, 1, 1) + h2.reshape(c1, 1, 1)
    return (conv(b.clamp(0, 6), w2) * s3.reshape(m2, 1, 1) + h3.reshape(m2, 1, 1)).numpy()


STEM_CASES = [  # image channels, stem channels, output channels, images and image (n, height, width), strides
    (3, 48, 16, (2, 32, 32), 2, 1),  # mobilenet_v2's first block in small: 16x16 planes, rows of 2 tiles + 4 pixels
    (3, 48, 24, (45, 37), 2, 1),  # odd image: 23x19 planes, the band's last phase one element short
    (3, 96, 16, (2, 30, 30), 1, 2),  # a stride-1 stem, a stride-2 depthwise window
    (1, 48, 8, (14, 14), 2, 1),  # one channel; a 7x7 plane of one image: threads split the channels
    (4, 48, 70, (3, 20, 26), 2, 1),  # four channels, 70 outputs
    (3, 48, 16, (1, 200, 200), 2, 1),  # 100x100: two strips, each in three chunks of channels (one band)
]


@pytest.mark.parametrize(("ci", "c1", "m2", "nhw", "stem_stride", "stride"), STEM_CASES)
def test_block_with_stem_matches_torch(
    ci: int, c1: int, m2: int, nhw: tuple[int, ...], stem_stride: int, stride: int, team_size: int
) -> None:
    """An image stem read only by a depthwise window, read only by a projection, is one IRBLOCK that computes the
    stem's rows straight into its scratch: as a team run (twice) and launched alone."""
    n, h, w = nhw if len(nhw) == 3 else (1, *nhw)
    ws = [
        rand((c1, ci, 3, 3), seed=1) / np.float32(3.0 * ci**0.5),
        rand((c1, 1, 3, 3), seed=2) / np.float32(3.0),
        rand((m2, c1, 1, 1), seed=3) / np.float32(c1**0.5),
        *(rand((c,), seed=10 + i) for i, c in enumerate((c1, c1, c1, c1, m2, m2))),
    ]
    x = rand((n, ci, h, w))
    f = _stem_block(ws, stem_stride, stride)
    what = f"stem block {ci}->{c1}->{m2} {n}x{h}x{w} s{stem_stride}/{stride}, {team_size} threads"
    _check_runs(f, x, ["IRBLOCK"], _torch_stem_block(x, ws, stem_stride, stride), what)


CHUNKED = {  # wide-plane cases run with WHOLE_CHUNK_ROWS=0: strips as short as one panel of channels needs
    "expand": lambda n: test_block_matches_torch(8, 96, 8, (52, 52), 1, True, n),  # two strips, two chunks each
    "without_expand": lambda n: test_block_without_expand_matches_torch(96, 40, (60, 60), 1, False, n),
    "stem": lambda n: test_block_with_stem_matches_torch(3, 48, 16, (1, 200, 200), 2, 1, n),  # three chunks each
}


@pytest.mark.parametrize("case", sorted(CHUNKED))
def test_blocks_in_chunks_of_channels_match_torch(case: str, team_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where strips short enough for all the expanded channels would be under WHOLE_CHUNK_ROWS rows, a strip runs its
    channels in chunks, each chunk's projection added to the sums of the ones before: that path against PyTorch."""
    monkeypatch.setattr(irblock_c, "WHOLE_CHUNK_ROWS", 0)
    CHUNKED[case](team_size)
