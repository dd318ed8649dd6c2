"""On devices that split reductions into work-groups (OpenCL), a reduction with GROUP_SPLIT_ONE_STAGE outputs or
more runs as one work-group per output with no second-stage launch (batch norm's stacked moments and backward sums
over 256+ channels); fewer outputs keep their partials. Batch norm's training gradients through that form against
PyTorch on every device."""

from __future__ import annotations

import numpy as np

import plait
from plait.schedule.scheduler import GROUP_SPLIT_ONE_STAGE, schedule
from tests.helpers import check_batch_norm_training


def _reduce_items(node: plait.Tensor) -> list[tuple]:
    return [it.out.arg for it in schedule([node.node], 256) if it.kind == "reduce"]


def test_many_outputs_take_one_stage() -> None:
    """512 channels over 4 * 32 * 32 values: one work-group each, one launch; 128 channels over the same length
    still split (a second stage sums the partials)."""
    assert GROUP_SPLIT_ONE_STAGE == 512
    wide = plait.tensor(np.zeros((4, 512, 32, 32), np.float32)).sum(axis=(0, 2, 3))
    assert _reduce_items(wide) == [("sum", (0, 2, 3), 1, 256)]
    narrow = plait.tensor(np.zeros((4, 128, 32, 32), np.float32)).sum(axis=(0, 2, 3))
    items = _reduce_items(narrow)
    assert len(items) == 2 and items[0][2] > 1, items


def test_batch_norm_gradients_over_256_channels_match_torch(device: str) -> None:
    """The stacked moments (2 x 256 outputs) and backward sums take the one-stage form on OpenCL."""
    check_batch_norm_training(device, (2, 256, 32, 32))
