"""The tensor-core tile heuristic for alexnet's batch-64 products starts from what `plait tune --model alexnet
--batch 64` found fastest on an H100 (docs/benchmarks.md, "NVIDIA GPU: alexnet at batch 64 and first compile"), so
an untuned device gets those tiles; products outside those shape classes keep their earlier tiles."""

from __future__ import annotations

import pytest

from plait.codegen.gemm import GemmSpec
from plait.tune import _tc_heuristic

FOLDED_64X64 = {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "FOLD": 1}
TILE_128X64 = {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32}
TILE_64X64 = {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32}


def _shared_weight(batch: int, m: int, n: int, k: int) -> GemmSpec:
    """Images sharing one weight (a convolution's products): A has no batch stride."""
    return GemmSpec(batch, m, n, k, (0, 0, k, 1), (0, k * n, n, 1))


def _own_weight(batch: int, m: int, n: int, k: int) -> GemmSpec:
    """A batch of products, each with its own A (Winograd's 16 products, a linear layer's K chunks)."""
    return GemmSpec(batch, m, n, k, (0, m * k, k, 1), (0, k * n, n, 1))


@pytest.mark.parametrize(
    ("spec", "knobs"),
    [
        (_shared_weight(64, 192, 729, 1600), FOLDED_64X64),  # the 5x5 layer: 0.834 -> 0.732 ms tuned
        (_own_weight(16, 256, 3136, 384), TILE_128X64),  # Winograd products of the 13x13 layers: 1.08-1.17x
        (_own_weight(16, 384, 3136, 192), TILE_128X64),
        (_own_weight(16, 256, 3136, 256), TILE_128X64),
        (_own_weight(6, 64, 4096, 1536), TILE_64X64),  # the classifier's K chunks (bench_split_k_cl.py)
        (_own_weight(16, 64, 1000, 256), TILE_64X64),
    ],
)
def test_alexnet_b64_products_take_the_tuned_tiles(spec: GemmSpec, knobs: dict[str, int]) -> None:
    assert _tc_heuristic(spec) == knobs


def test_other_classes_keep_their_tiles() -> None:
    """Fewer than 1024 K or 128-row-aligned rows keep 64x128 (alexnet's 256-row implicit products tuned so), and
    Winograd products of other widths or depths keep the work-group count rules."""
    assert _tc_heuristic(_shared_weight(64, 192, 729, 576))["BN"] == 128
    assert _tc_heuristic(_shared_weight(1, 256, 10816, 3456))["BN"] == 128
    assert _tc_heuristic(_own_weight(16, 128, 12544, 128)) != TILE_128X64  # resnet's 28x28 layers at batch 64
    assert _tc_heuristic(_own_weight(16, 512, 3136, 512)) != TILE_128X64  # vgg16's 14x14 layers: not measured
