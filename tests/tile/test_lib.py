"""The standard contractions written in Tile, forward and backward against PyTorch on every device."""

from __future__ import annotations

import pytest
import torch

from plait.tile import lib
from tests.helpers import check_op

F = torch.nn.functional

CASES = {
    "matmul": (lib.matmul, lambda a, b: a @ b, [(5, 7), (7, 3)]),
    "batch_matmul": (lib.batch_matmul, lambda a, b: a @ b, [(2, 5, 7), (2, 7, 3)]),
    "conv1d": (
        lambda a, b: lib.conv1d(a, b, stride=2, padding=1, dilation=2),
        lambda a, b: F.conv1d(a, b, None, 2, 1, 2),
        [(2, 4, 11), (3, 4, 3)],
    ),
    "conv2d": (
        lambda a, b: lib.conv2d(a, b, stride=2, padding=1),
        lambda a, b: F.conv2d(a, b, None, 2, 1),
        [(2, 3, 9, 8), (4, 3, 3, 3)],
    ),
    "conv2d_groups_dilation": (
        lambda a, b: lib.conv2d(a, b, stride=(1, 2), padding=(1, 0), dilation=(2, 1), groups=2),
        lambda a, b: F.conv2d(a, b, None, (1, 2), (1, 0), (2, 1), 2),
        [(2, 4, 9, 8), (6, 2, 3, 2)],
    ),
    "conv2d_depthwise": (
        lambda a, b: lib.conv2d(a, b, padding=1, groups=4),
        lambda a, b: F.conv2d(a, b, None, 1, 1, 1, 4),
        [(2, 4, 7, 6), (4, 1, 3, 3)],
    ),
    "conv3d": (
        lambda a, b: lib.conv3d(a, b, stride=(1, 2, 1), padding=1),
        lambda a, b: F.conv3d(a, b, None, (1, 2, 1), 1),
        [(1, 2, 5, 4, 6), (3, 2, 3, 3, 3)],
    ),
    "conv_transpose2d": (
        lambda a, b: lib.conv_transpose2d(a, b, stride=2, padding=1, output_padding=1),
        lambda a, b: F.conv_transpose2d(a, b, None, 2, 1, 1),
        [(2, 3, 5, 4), (3, 2, 3, 3)],
    ),
    "conv_transpose2d_groups_dilation": (
        lambda a, b: lib.conv_transpose2d(a, b, stride=(2, 3), padding=(1, 0), groups=2, dilation=(1, 2)),
        lambda a, b: F.conv_transpose2d(a, b, None, (2, 3), (1, 0), 0, 2, (1, 2)),
        [(2, 4, 5, 4), (4, 3, 3, 2)],
    ),
    "max_pool2d": (lambda a: lib.max_pool2d(a, 3, 2, 1), lambda a: F.max_pool2d(a, 3, 2, 1), [(2, 3, 9, 8)]),
    "avg_pool2d": (
        lambda a: lib.avg_pool2d(a, (2, 3), (2, 1), (1, 1)),
        lambda a: F.avg_pool2d(a, (2, 3), (2, 1), (1, 1)),
        [(2, 3, 9, 8)],
    ),
    "dilated_conv2d_per_axis": (
        lambda a, b: lib.dilated_conv2d(a, b, steps=(1, 3), stride=(2, 1)),
        lambda a, b: F.conv2d(a, b, None, (2, 1), 0, (1, 3)),
        [(2, 3, 9, 12), (4, 3, 3, 3)],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_standard_contraction(name: str, device: str) -> None:
    fn, ref, shapes = CASES[name]
    check_op(fn, shapes, device, torch_fn=ref)
