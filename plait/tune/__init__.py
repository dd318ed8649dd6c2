"""Kernel knobs: the tuned winner per (device, kernel signature) from the tuning cache, else a heuristic.

`tune_gemm` times a bounded set of candidates on the device and remembers the fastest in the cache file
(one JSON file per device under the cache dir), so later plans pick it up with no search.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from plait.runtime import cache
from plait.runtime.base import Device

_memo: dict[str, dict[str, Any]] = {}


def _db_key(device: Device) -> str:
    if device.info.kind == "cpu":  # the register tiles follow the vector width (plait/codegen/simd.py)
        from plait.codegen import gemm_c

        return cache.key_of("tune", "cpu", device.info.name, device.info.driver, f"vw{gemm_c.VW}")
    return cache.key_of("tune", device.info.kind, device.info.name, device.info.driver)


def _db(device: Device) -> dict[str, Any]:
    key = _db_key(device)
    if key not in _memo:
        raw = cache.get("tune", key)
        try:
            _memo[key] = json.loads(raw) if raw else {}
        except ValueError:
            _memo[key] = {}
    return _memo[key]


def signature(kind: str, spec: Any) -> str:
    """The tuning cache's key for one kernel: its kind and every field of its spec."""
    return f"{kind}:{json.dumps(asdict(spec), sort_keys=True)}"


def remember(device: Device, kind: str, spec: Any, knobs: dict[str, int]) -> None:
    """Cache `knobs` as the tuned choice for this kernel on `device` ({} keeps the heuristic, marked as tuned)."""
    db = _db(device)
    db[signature(kind, spec)] = knobs
    cache.put("tune", _db_key(device), json.dumps(db, sort_keys=True).encode())


def _heuristic(device: Device, kind: str, spec: Any) -> dict[str, int]:
    if kind == "gemm" and device.renderer.dialect == "opencl":
        from plait.codegen.gemm_small import MAX_ROWS
        from plait.codegen.gemm_tc import mma_tf32_unsupported

        if spec.m <= MAX_ROWS:  # few rows: stream B once (kernel kind GEMV)
            return {"V": 4}
        if mma_tf32_unsupported(device) is None:
            return _tc_heuristic(spec)
        if spec.m * spec.n < 64 * 64 * 32:
            return {"TSM": 32, "TSN": 32, "TSK": 16, "WPTM": 2, "WPTN": 2}
    return {}


def _tc_heuristic(spec: Any) -> dict[str, int]:
    """Tensor-core tiles, from the sweeps of benchmarks/bench_gemm_tc.py and `plait tune --model` on an H100
    (docs/benchmarks.md, 2026-11-22): a batch of narrow products sharing A (late convolution layers) folds into one
    wide product when whole tiles would waste over 10% of their columns. Then the tile is picked by how many
    work-groups it makes, as the tuned winners were:

    - Winograd's 16 products of 256-384 rows over 2-4k tile columns with K <= 512 (alexnet b64's 13x13 layers,
      resnet's 14x14 ones at batch 64): 128x64 tiles of four 64x32 warp tiles (1.08-1.17x over 128x128);
    - a linear layer's K chunks at batch 64 or less (split-K, scheduler.STREAM_SPLIT_TARGET), K <= 2048 and
      256 or more 64x64 tiles: 64x64 with BK 32 (alexnet b64's classifier 0.291 against 0.350 ms with 64x32 tiles);
    - few 64x64 tiles (batch-1 layers): small tiles, warps splitting K to shorten each tile's chain; 64x32 ones
      while 64x64 tiles would not fill two waves (vgg16 b1 256x3136x2304: 1.28x over 64x64);
    - few 128x128 tiles: 64x64 ones (K 4608, resnet18 b64's last stage folded: BK 32, 1.17x);
    - rows that 128-row tiles pad by over 15% with K >= 1024 (alexnet b64's 5x5 layer, 192 x 729 per image,
      K 1600): 64x64 tiles with BK 32, the batch folded into the columns (1.14x over 64x128);
    - 64-row products, or 128-row tiles padding the rows by over 15% with a shorter K or making under two waves of
      work-groups two to an SM (alexnet b64's 256x10816 products: 1.31x; resnet18's 256x12544: 1.24x): 64x128;
    - many 128x256 tiles that the columns fill (vgg16 b64's 256x200704x2304 and 512x50176x4608 folded: 1.14x,
      1.17x; a 4096^3 matmul: the fastest in the sweep): 128x256 with BK 8;
    - alexnet b64's training products (benchmarks/sweep_step_gemms.py): implicit convolutions in 64x128 tiles
      with KS 2 (`_gather_ks`), weight gradients in short chunks (`_short_chunk_rows`) and a linear layer's
      weight gradient (`_outer_product`) in 128x64 tiles, KS 2 for large-kernel gathered weight gradients
      (`_large_gather_ks`) and 64x64 KS 2 tiles for Winograd's 192-row products (`_ragged_batched_rows`);
    - else 128x128 tiles of four 64x64 warp tiles (16-18% faster than eight 64x32 ones on vgg16's
      256x3136x2304 and 512x784x4608), two to an SM; eight 32x64 warp tiles, one to an SM, where that evens out
      the last wave (resnet18 b64's 128x50176x1152: 392 work-groups, 1.39x).

    A Winograd weight gradient's products and F(2, 5)'s products take their own rules first
    (`winograd_cl.wgrad_knobs`, `winograd_cl.product_knobs`)."""
    from plait.codegen.winograd_cl import product_knobs, wgrad_knobs

    if (wino := wgrad_knobs(spec) or product_knobs(spec)) is not None:
        return wino
    if _weight_gradient(spec):
        if _wide_weight_gradient(spec):
            return {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64}
        if _short_chunk_rows(spec):
            return {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32, "KS": 2}
        return {
            "V": 3,
            "BM": 64,
            "BN": 64,
            "BK": 32 if spec.k >= 512 else 16,
            "WM": 32,
            "WN": 32,
            **_large_gather_ks(spec),
        }
    shared_a = spec.batch > 1 and spec.a[1] == 0 and spec.a_inner == 0
    if _ragged_batched_rows(spec, shared_a):
        return {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "KS": 2}
    fold = shared_a and _padded(spec.n, 128) > 1.1 * spec.n
    cols, batches = (spec.batch * spec.n, 1) if fold else (spec.n, spec.batch)
    extra = {"FOLD": 1} if fold else {}

    def blocks(bm: int, bn: int) -> int:
        return batches * -(-spec.m // bm) * -(-cols // bn)

    if not shared_a and spec.batch > 1 and 256 <= spec.m <= 384 and 2048 < spec.n <= 4096 and spec.k <= 512:
        return {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32}
    stream = spec.conv is None and spec.m <= 64 and spec.n >= 1000 and spec.k <= 2048
    if stream and not shared_a and spec.batch > 1 and blocks(64, 64) >= 256:
        return {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32}
    if blocks(64, 64) < 132:  # batch-1 layers: small tiles, warps splitting K to shorten each tile's chain
        if blocks(64, 32) >= 96:
            return {"V": 3, "BM": 64, "BN": 32, "BK": 32, "WM": 32, "WN": 16, "WK": 2, **extra}
        return {"V": 3, "BM": 32, "BN": 32, "BK": 32, "WM": 16, "WN": 16, "WK": 4 if spec.k >= 1024 else 2, **extra}
    if blocks(128, 128) < 132:
        if blocks(64, 64) < 264:
            return {"V": 3, "BM": 64, "BN": 32, "BK": 32, "WM": 32, "WN": 16, "WK": 2, **extra}
        if spec.k >= 2048:
            return {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, **extra}
        return {"V": 3, "BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 16, **extra}
    if spec.m > 64 and _padded(spec.m, 128) > 1.15 * spec.m and spec.k >= 1024:
        if spec.conv is not None:  # an implicit convolution: 64x128 tiles, two k8 steps per add (`_gather_ks`)
            return {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2, **extra}
        return {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, **({"FOLD": 1} if shared_a else {})}
    if spec.m <= 64 or _padded(spec.m, 128) > 1.15 * spec.m or blocks(128, 128) < 264:
        return {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64, **extra, **_gather_ks(spec)}
    if _outer_product(spec) and blocks(128, 64) >= 264:
        return {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32}
    wide = _padded(cols, 256) <= 1.03 * cols and blocks(128, 256) >= 264
    if spec.k >= 1024 and (wide or (spec.m >= 1024 and cols >= 1024)):
        return {"V": 3, "BM": 128, "BN": 256, "BK": 8, "WM": 64, "WN": 64, **extra}
    n128 = blocks(128, 128)
    if _padded(n128, 132) < _padded(n128, 264) - 0.1 * n128:  # one eight-warp group per SM wastes less of a wave
        return {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2, **extra}
    return {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64, **extra}


def _gather_ks(spec: Any) -> dict[str, int]:
    """Knobs added to an implicit convolution's 64x128 tiles: the four-column gathers where they apply
    (`_four_columns`), else two k8 steps per FP32 add (KS 2) alone. On an H100 KS 2 ran alexnet b64's 5x5 input
    gradient `64x64x729x4800` 0.910 -> 0.708 ms and its stem `1x64x193600x363` 0.281 -> 0.230; its 5x5 forward
    `1x192x46656x1600` ran 0.670 ms in these tiles against 0.722 in the 64x64 BK 32 ones that won without KS 2
    (benchmarks/sweep_step_gemms.py, docs/benchmarks.md)."""
    if spec.conv is None:
        return {}
    return _four_columns(spec) or {"KS": 2}


def _large_gather_ks(spec: Any) -> dict[str, int]:
    """KS 2 for a weight gradient gathered from the image (`conv_t`) with a 5x5 or larger kernel, in 64x64 tiles
    with BK 32. On an H100 it ran alexnet b64's 5x5 `18x192x1600x2592` 0.730 -> 0.713 ms and its 11x11 stem
    `121x64x363x1600` 0.295 -> 0.289 (benchmarks/sweep_step_gemms.py, docs/benchmarks.md). resnet's 7x7 stems
    (`392x64x147x2048`) take it too, not swept alone; the 3x3 layers' products of resnet and vgg16 were not swept
    with it and keep one k8 step per add."""
    win = spec.conv_t
    return {"KS": 2} if win is not None and win.kh * win.kw >= 25 and spec.k >= 512 else {}


def _ragged_batched_rows(spec: Any, shared_a: bool) -> bool:
    """A batch of wide products (1024+ columns) each with its own A (Winograd's 16) whose rows pad 128-row tiles by
    over 15%, with K of 256 or more: 64x64 tiles with BK 32 and KS 2. alexnet b64's input gradient through its
    192-filter 3x3 layer, `16x192x3136x384`, ran 0.238 ms in the 64x128 tiles the row-padding rule gives and 0.212
    in these on an H100 (benchmarks/sweep_step_gemms.py); resnet's, vgg16's and mobilenet_v2's products have 64 or
    a multiple of 128 rows, or few columns, and do not take it."""
    ragged = spec.m > 64 and _padded(spec.m, 128) > 1.15 * spec.m
    return spec.conv is None and spec.batch > 1 and not shared_a and ragged and spec.k >= 256 and spec.n >= 1024


def _short_chunk_rows(spec: Any) -> bool:
    """A weight gradient of 256+ rows (whole 128-row tiles) split into chunks shorter than
    `scheduler.SPLIT_K_GRAD_MIN` (the short-chunk rule of `scheduler._grad_parts`: alexnet b64's 13x13 layers, 13
    chunks of 832): 128x64 tiles with 64x32 warp tiles and KS 2 ran its three products 0.482 -> 0.415,
    0.355 -> 0.308 and 0.333 -> 0.305 ms against 64x64 tiles with BK 32 on an H100."""
    from plait.schedule import scheduler

    return spec.m >= 256 and spec.m % 128 == 0 and spec.k < scheduler.SPLIT_K_GRAD_MIN


def _outer_product(spec: Any) -> bool:
    """A linear layer's weight gradient `dy^T @ x` at a batch of at most 64 (A read transposed, K = the batch):
    a few k8 steps per tile, so the many 128x128 tiles spend their time outside the k loop. 128x64 tiles with
    64x32 warp tiles ran alexnet b64's `1x4096x9216x64` 0.223 -> 0.178 ms and `1x4096x4096x64` 0.110 -> 0.082
    on an H100."""
    return spec.batch == 1 and spec.conv is None and spec.a[2] == 1 and spec.k <= 64 and spec.m % 128 == 0


def _four_columns(spec: Any) -> dict[str, int]:
    """Knobs for a 64-row implicit 3x3-or-larger convolution over 64+ channels whose columns gather four at a time
    (`gemm_tc._vector_conv`): VG=1 and two k8 steps per FP32 add (KS 2). On an H100 they ran the 64-filter
    products 7-13% faster in 64x128 tiles (benchmarks/sweep_wgrad_cl.py: vgg16 b64's `1x64x3211264x576` 6.14 ->
    5.62 ms, `1x64x802816x1152` 2.96 -> 2.74, `64x64x50176x576` 6.31 -> 5.47; resnet18's and resnet50's
    `1x64x200704x576` 0.408 -> 0.372 and 0.406 -> 0.375). VG alone was mixed (the forward 3% slower, the input
    gradient 9% faster); KS 2 with 64x64 warp tiles ran 1.3-1.5x slower."""
    from plait.codegen.gemm_tc import _vector_conv

    if spec.conv is None or spec.m > 64 or spec.k < 576 or not _vector_conv(spec):
        return {}
    return {"KS": 2, "VG": 1}


def _weight_gradient(spec: Any) -> bool:
    """A convolution's weight gradient as the scheduler splits it (`scheduler._split_k`): both operands contiguous
    along K, at most 1024 x 4608 outputs per product, enough of them for 264 tiles of 64x64. 64x64 tiles with BK 32
    ran these fastest on an H100 (resnet18 b64's 64x576 product as 32 chunks of K 6272: 0.54 ms; 64x32 tiles with
    two warps along K 0.59, 64x128 0.73, 32x32 0.70)."""
    tiles = spec.batch * -(-spec.m // 64) * -(-spec.n // 64)
    k_major = spec.a[3] == 1 and spec.b[2] == 1 and spec.conv is None
    return k_major and spec.m <= 1024 and spec.n <= 4608 and tiles >= 264


def _wide_weight_gradient(spec: Any) -> bool:
    """A weight gradient that the scheduler split for 128x128 tiles (`scheduler._wide_grad_parts`: at least
    256 x 2304 outputs, chunks of 4096 or more, 1056 or more such tiles): those tiles with 64x64 per warp ran
    vgg16 b64's 256 x 2304 and 512 x 4608 products 1.20-1.24x faster than 64x64 tiles on an H100 (4.92-4.95 ms
    against 5.96-6.09 in fewer chunks, benchmarks/sweep_train_gemms.py)."""
    from plait.schedule import scheduler

    tiles128 = spec.batch * -(-spec.m // 128) * -(-spec.n // 128)
    return (
        spec.m >= scheduler.SPLIT_K_WIDE_ROWS
        and spec.n >= scheduler.SPLIT_K_WIDE_COLS
        and spec.k >= scheduler.SPLIT_K_WIDE_MIN
        and tiles128 >= scheduler.SPLIT_K_GRAD_TARGET
    )


def _padded(size: int, tile: int) -> int:
    """`size` rounded up to whole tiles."""
    return -(-size // tile) * tile


def knobs_for(device: Device, kind: str, spec: Any) -> dict[str, int]:
    """The cached winner for this kernel signature, else the heuristic; tensor-core knobs are checked against the
    device's mma probe, so a stale cache entry raises instead of failing to build."""
    knobs = _db(device).get(signature(kind, spec)) or _heuristic(device, kind, spec)
    if knobs.get("V") == 3:
        from plait.codegen.gemm_tc import check_device

        check_device(device, knobs)
    return knobs


GEMM_CANDIDATES = {
    # register tiles that won at least one product in benchmarks/bench_tiles_c.py on AVX-512 (16-float vectors): 8x48
    # most often, 6x64 and 12x32 on 49 columns, 4x96, 16x16 and 24x16 on single cells (resnet50's 512x196x1024 for
    # 24x16); narrower vectors take gemm_c.TILES (`candidates`)
    "c": [
        {"MR": 8, "NR": 48},
        {"MR": 6, "NR": 64},
        {"MR": 12, "NR": 32},
        {"MR": 4, "NR": 96},
        {"MR": 16, "NR": 16},
        {"MR": 24, "NR": 16},
    ],
    "opencl": [
        {"TSM": 64, "TSN": 64, "TSK": 16, "WPTM": 4, "WPTN": 4},
        {"TSM": 128, "TSN": 128, "TSK": 16, "WPTM": 8, "WPTN": 8},
        {"TSM": 64, "TSN": 128, "TSK": 16, "WPTM": 4, "WPTN": 8},
        {"TSM": 32, "TSN": 32, "TSK": 16, "WPTM": 2, "WPTN": 2},
        {"V": 2, "TSK": 8},
        {"V": 2, "TSK": 16},
    ],
    "tc": [
        {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 32},
        {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64},
        {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 64, "KS": 2},
        {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 64, "WN": 32, "KS": 2},
        {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 32, "WN": 64},
        {"V": 3, "BM": 128, "BN": 128, "BK": 16, "WM": 32, "WN": 64, "KS": 2},
        {"V": 3, "BM": 128, "BN": 256, "BK": 8, "WM": 64, "WN": 64},
        {"V": 3, "BM": 256, "BN": 128, "BK": 8, "WM": 64, "WN": 64},
        {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32, "KS": 2},
        {"V": 3, "BM": 128, "BN": 64, "BK": 16, "WM": 64, "WN": 32},
        {"V": 3, "BM": 64, "BN": 128, "BK": 16, "WM": 32, "WN": 64},
        {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32},
        {"V": 3, "BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 16},
    ],
    # few output tiles (batch 1): small tiles for more work-groups, warps splitting K for shorter chains
    "tc_small": [
        {"V": 3, "BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32},
        {"V": 3, "BM": 64, "BN": 64, "BK": 16, "WM": 32, "WN": 32, "WK": 2},
        {"V": 3, "BM": 64, "BN": 32, "BK": 32, "WM": 32, "WN": 16, "WK": 2},
        {"V": 3, "BM": 32, "BN": 32, "BK": 32, "WM": 16, "WN": 16},
        {"V": 3, "BM": 32, "BN": 32, "BK": 32, "WM": 16, "WN": 16, "WK": 2},
        {"V": 3, "BM": 32, "BN": 32, "BK": 32, "WM": 16, "WN": 16, "WK": 4},
        {"V": 3, "BM": 32, "BN": 64, "BK": 32, "WM": 16, "WN": 32, "WK": 2},
    ],
}


def candidates(device: Device, spec: Any = None) -> list[dict[str, int]]:
    """The GEMM configurations worth timing on `device`: tensor-core ones only where the mma probe passed.

    Given the product's `spec`, the tensor-core list is narrowed to what can win, so tuning a model stays within
    its budget: the big tiles or the few-tile ones by the product's size, no tile padding the rows by half or
    more, each also with the batch folded into the columns where per-image widths waste part of a tile, for a
    convolution the heuristic's tiles without the k-table gather (GT=0), and none of the FP32 templates (a third
    of the tensor cores' speed or less in every sweep)."""
    dialect = device.renderer.dialect
    if dialect == "opencl":
        from plait.codegen.gemm_tc import mma_tf32_unsupported

        if mma_tf32_unsupported(device) is None:
            if spec is None:
                return GEMM_CANDIDATES["tc"] + GEMM_CANDIDATES["tc_small"] + GEMM_CANDIDATES["opencl"]
            return _tc_candidates(spec)
    if dialect == "c":
        from plait.codegen import gemm_c

        if gemm_c.VW != 16:  # the listed tiles are AVX-512's; narrower vectors take their own (gemm_c.TILES)
            return [{"MR": mr, "NR": nv * gemm_c.VW} for mr, nv in gemm_c.TILES]
    return GEMM_CANDIDATES[dialect]


def _tc_candidates(spec: Any) -> list[dict[str, int]]:
    shared_a = spec.batch > 1 and spec.a[1] == 0 and spec.a_inner == 0

    def blocks(tile: int) -> int:
        return spec.batch * -(-spec.m // tile) * -(-spec.n // tile)

    # the heuristic's size classes: few-tile products, a middle ground where either kind may win, large ones
    if blocks(64) < 132:
        pool = GEMM_CANDIDATES["tc_small"]
    elif blocks(128) < 264:
        pool = GEMM_CANDIDATES["tc"] + GEMM_CANDIDATES["tc_small"]
    else:
        pool = GEMM_CANDIDATES["tc"]
    pool = [c for c in pool if _padded(spec.m, c["BM"]) < 1.5 * spec.m] or pool
    if shared_a and _padded(spec.n, 64) > 1.03 * spec.n:
        pool = pool + [{**c, "FOLD": 1} for c in pool]
    if spec.conv is not None:  # the heuristic's tiles gathering without the k-table, to keep the table honest
        pool = [*pool, {**_tc_heuristic(spec), "GT": 0}]
    return pool


def tune_gemm(device: Device, spec: Any, budget_s: float = 20.0) -> dict[str, int]:
    """Time each candidate GEMM configuration for `spec` (within `budget_s`) and cache the fastest."""
    from plait.codegen import gemm

    render = gemm.render_c if device.renderer.dialect == "c" else gemm.render_opencl
    a = device.allocator.alloc(4 * (spec.a[0] + spec.batch * max(spec.a[1], 1) * spec.m * spec.k + spec.m * spec.k))
    b = device.allocator.alloc(4 * (spec.b[0] + spec.batch * max(spec.b[1], 1) * spec.k * spec.n + spec.k * spec.n))
    c = device.allocator.alloc(4 * spec.batch * spec.m * spec.n)
    best: tuple[float, dict[str, int]] | None = None
    start = time.perf_counter()
    for knobs in candidates(device):
        if time.perf_counter() - start > budget_s:
            break
        k = render(spec, knobs)
        try:
            launch = device.compile(k.source, k.name).bind([c, a, b], k.global_size, k.local_size)
        except Exception:
            continue
        launch()
        device.synchronize()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            launch()
            device.synchronize()
            times.append(time.perf_counter() - t0)
        t = sorted(times)[len(times) // 2]
        if best is None or t < best[0]:
            best = (t, knobs)
    for buf in (a, b, c):
        device.allocator.free(buf.nbytes, buf.handle)
    chosen = best[1] if best else {}
    remember(device, "gemm", spec, chosen)
    return chosen
