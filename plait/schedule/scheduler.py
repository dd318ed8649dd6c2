"""Fusion decisions. Every node in `realize` gets a buffer and a kernel; everything else is inlined into the
kernels that read it (elementwise chains, movement ops, the input expression of a reduction)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from plait import dtypes
from plait.codegen import conv_s2_c, gemm_c, pointwise_c, stem_pool_c, winograd_c, winograd_cl
from plait.codegen.cstyle import MAX_STACK_MEMBERS
from plait.codegen.expr import strides_of
from plait.codegen.gemm import Epilogue, GemmSpec, packed_tile
from plait.graph.node import Node, toposort
from plait.graph.ops import OPS, kind
from plait.graph.ops.conv import Window
from plait.graph.ops.matmul import matmul
from plait.graph.ops.movement import permute, reshape
from plait.graph.ops.pointwise_weight import pointwise_weight
from plait.graph.ops.reduce import reduce
from plait.graph.ops.winograd import winograd_weight
from plait.graph.ops.winograd_cl import winograd_cl_input, winograd_cl_weight

MAX_INLINE_COST = 160  # beyond this a shared subexpression is cheaper to store than to recompute
SHARED_INLINE_COST = 12
# On devices with cores to spare (split_parts >= SPLIT_WIDE_PARTS: OpenCL), an expression read by several kernels
# that costs at most this and reads one buffer of its own size (`_planes_read`) is recomputed by each reader
# rather than stored: the readers' traffic is the same either way, the store adds a write and a launch. Batch
# norm's normalised input (cost 13) and ReLU6 output in a training step: mobilenet_v2 b64 1041 -> 999 kernels,
# 36.5 -> 32.8 GB of compulsory traffic (benchmarks/train_step_items.py). The cpu keeps storing them.
PLANE_RECOMPUTE_COST = 32


@dataclass
class Item:
    """One kernel: it writes `out` and reads `inputs` (buffers). `gemm` is set for matrix products."""

    out: Node
    inputs: list[Node]
    kind: str
    gemm: GemmSpec | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def epilogue(self) -> Epilogue | None:
        """The fused epilogue of a product item (GEMM, pointwise or Winograd) that the scheduler gave one (it sets
        extra["epilogue"] and extra["extra"] together), else None."""
        if "epilogue" not in self.extra:
            return None
        return Epilogue(self.out, self.extra["epilogue"], tuple(self.extra["extra"]))


SPLIT_WIDE_PARTS = 64  # devices whose reductions split this many ways or more have cores to spare per output
MAX_CHUNK_SUM = 32  # chunk sums of up to this many chunks are added in the elementwise kernel that reads them
GROUP_SPLIT_TARGET = 1056  # work-groups a group-split reduction aims for on such devices: 8 per SM of an H100
GROUP_SPLIT_MIN_PER_ITEM = 4  # fewest values each work-item of a group-split partial sums
# A group-split reduction with at least this many outputs runs as one work-group per output and no second stage:
# 512 work-groups of 256 (about 1000 work-items per SM of an H100) keep enough loads in flight, and the second
# stage's launch costs more than the extra partials gain. Batch norm's stacked moments and backward sums over 256+
# channels (resnet's 14x14 and 7x7 layers at batch 64: 2 or 3 partials each before) lose a launch each.
GROUP_SPLIT_ONE_STAGE = 512
# On such devices a reduction over the innermost axis with at least this many values per output and few outputs
# is group-split too (one work-group per output when the values are under GROUP_SPLIT_MIN_PER_ITEM per work-item):
# a cross-entropy's max, sum of exponentials and picked-logit sum over 1000 classes for 64 images ran as 64
# work-items looping 1000 times, 43-65 us each on an H100 (alexnet and resnet18 b64 training steps).
GROUP_SPLIT_MIN_VALUES = 256


def _split_reductions(order: list[Node], parts: int) -> bool:
    """Split long reductions with few outputs into partial reductions and a short second stage, so that more
    work-items than outputs share the long axis.

    On devices split `parts` ways (OpenCL: 256) each partial is a work-group of `parts` work-items that combine
    their sums in local memory (`rsplit`'s fourth argument), and an output gets as many partials as bring the
    reduction to about GROUP_SPLIT_TARGET work-groups (one when it has GROUP_SPLIT_ONE_STAGE outputs or more: then
    there is no second stage). That covers reductions with up to 16 * parts outputs and GROUP_SPLIT_MIN_VALUES or
    more values each: the per-channel sums of batch norm in a training step (64 to 512 channels over N*H*W = 3k-200k
    values) ran one work-item per channel (86-93% of an H100 training step at batch 64), then 256 work-items per channel
    (16k work-items for 64 channels: too few loads in flight to reach more than ~230 GB/s).
    A work-group reads consecutive positions of the reduced axes, so this needs them to include the innermost
    axis: a reduction over outer axes only (a bias gradient's sum over rows) keeps adjacent work-items on adjacent
    outputs, split (from 4096 values) into `parts` interleaved one-work-item partials.
    Elsewhere (cpu: 16 ways) a partial is one work-item's contiguous chunk of 256 or more values."""
    changed = False
    wide = parts >= SPLIT_WIDE_PARTS
    most, least = (16 * parts, GROUP_SPLIT_MIN_VALUES) if wide else (64, 32768)
    for node in order:
        if not node.op.startswith("r") or node.op not in ("rsum", "rmax", "rmin", "rprod"):
            continue
        src = node.srcs[0]
        red = math.prod(src.shape[a] for a in node.arg)
        inner = max((a for a, d in enumerate(src.shape) if d > 1), default=0) in node.arg
        if node.size > most or red < (least if inner or not wide else 4096):
            continue
        op = node.op[1:]
        if wide and inner:
            # a sum over a stack along axis 0 sums its members in one work-group (cstyle `_stacked_members`)
            members = src.shape[0] if op == "sum" and 0 not in node.arg and 1 < src.shape[0] <= MAX_STACK_MEMBERS else 1
            groups = node.size // members
            p = max(1, min(-(-GROUP_SPLIT_TARGET // groups), red // (GROUP_SPLIT_MIN_PER_ITEM * parts)))
            p = 1 if node.size >= GROUP_SPLIT_ONE_STAGE else p
            group = parts
        elif wide:
            p, group = min(parts, red // 64), 1
        else:
            p, group = min(parts, red // 256), 1
        part = Node("rsplit", (src,), (op, node.arg, p, group), (*node.shape, p), node.dtype, node.device)
        whole = reduce(op, part, (len(part.shape) - 1,)) if p > 1 else part
        node.op, node.srcs, node.arg = "reshape", (whole,), node.shape
        changed = True
    return changed


SPLIT_K_TARGET = 264  # work-groups (32x32 tiles) a split-K product aims for: two per SM of an H100
SPLIT_K_MIN = 256  # shortest K chunk worth a work-group of its own
# A linear layer's product at a batch of at most 64 rows streams its weight once: alexnet's classifier at batch 64
# on an H100 ran 0.350 ms in 2 / 2 / 8 chunks and 0.291 ms in 6 / 8 / 16 chunks of K <= 1536 (with 64x64 tiles,
# BK 32: benchmarks/bench_split_k_cl.py), so these aim for more work-groups, in chunks of at most STREAM_SPLIT_MAX_K
STREAM_SPLIT_TARGET = 1056
STREAM_SPLIT_MAX_K = 2048
STREAM_GRAD_MIN_K = 512  # shortest K chunk of a linear layer's input gradient (`_input_grad_parts`)
# A weight gradient (both operands contiguous along K = images x positions) splits into chunks that make this many
# 64x64 tiles (eight per SM of an H100), each chunk at least SPLIT_K_GRAD_MIN long and at most SPLIT_K_GRAD_MAX
# chunks: resnet18 b64's 64x576 product over K 200704 ran 0.98 ms as 8 chunks, 0.78 as 16, 0.54 as 32 (64x32
# tiles), 0.46 as 64 and 0.41 as 128 (64x64 tiles, BK 32); its 128x1152, 256x2304 and stem products gained the same
# 12% going from 576 to 1152 tiles. Products with fewer than 64 rows or columns take this rule where K is at least
# SPLIT_K_GRAD_LONG (mobilenet_v2's first layer: 32 x 27 outputs over K 802816 ran 1.16 ms as 16 chunks).
SPLIT_K_GRAD_TARGET = 1056
SPLIT_K_GRAD_MIN = 1024
SPLIT_K_GRAD_MAX = 512
SPLIT_K_GRAD_LONG = 1 << 18
SPLIT_K_IMAGE_MIN = 128  # whole-image chunks of a 1x1 weight gradient this long still split (mobilenet_v2's 14x14)
# A weight gradient with at least SPLIT_K_WIDE_ROWS x SPLIT_K_WIDE_COLS outputs whose K allows chunks of at least
# SPLIT_K_WIDE_MIN that make SPLIT_K_GRAD_TARGET tiles of 128x128 splits that way (and runs those tiles, with 64x64
# per warp: plait/tune `_tc_heuristic`): vgg16 b64's 256 x 2304 products over K 200704 ran 5.96 ms as 8 chunks of
# 64x64 tiles, 4.95 ms as 32 chunks of 128x128; its 512 x 4608 over K 50176 6.09 ms as 2 chunks, 4.92 as 8 (H100,
# benchmarks/sweep_train_gemms.py); with the chunks of the 64x64 rule 128x128 tiles were 1.16-1.19x slower
SPLIT_K_WIDE_ROWS = 256
SPLIT_K_WIDE_COLS = 2304
SPLIT_K_WIDE_MIN = 4096


def _patch_taps(b: Node) -> int:
    """Taps per channel (kh * kw) of the im2col that `b` views through movement ops, else 1."""
    while kind(b) == "movement" and not b.realized:
        b = b.srcs[0]
    return b.arg.kh * b.arg.kw if b.op == "im2col" and not b.realized else 1


def _split_k(order: list[Node], keep: set[int]) -> bool:
    """Split the K of few-tile single products (batch-1 late convolution layers: 512 x 49 outputs, K = 4608; the
    weight gradient of a training convolution: 64 x 576 outputs, K = images x positions) into S chunks: a batch of
    S partial products, each its own work-groups, summed by a reduction over S (fixed order, so the result is
    deterministic). K chunks hold whole filter windows (im2col's kh * kw taps) where B is patch columns the GEMM
    could gather from the image. An A operand that is no view (the transposed output gradient of a folded
    convolution) is added to `keep`: realized contiguous, its chunks are views."""
    changed = False
    for node in order:
        if node.op != "matmul" or node.realized or math.prod(node.shape[:-2]) != 1:
            continue
        a, b = node.srcs
        # never for fewer than 16 rows: a linear layer's batch-1 product (x @ W^T) stays a GEMV, where the swapped
        # W @ x^T would split into a one-column GEMM (alexnet b1 on an H100: 0.26 -> 0.37 ms)
        flip = a.shape[-2] >= 16 and a.shape[-1] >= max(a.shape[-2], b.shape[-1]) and _is_transpose(b)
        # a weight gradient written (columns @ dy^T)^T reads the columns (a view) as A and dy^T (no view) as B: as
        # dy @ columns^T the long-K rule reads both in place, so that form is tried first
        first = flip and strided_view(a, set()) is not None and strided_view(b.srcs[0], set()) is None
        if first and _split_swapped(node, keep):
            changed = True
        elif _split_k_one(node, keep) or (flip and _split_swapped(node, keep)):
            changed = True
    return changed


def _split_swapped(node: Node, keep: set[int]) -> bool:
    """Split product `node` = A @ B as (B^T @ A^T)^T; `node` becomes the transpose of the split product."""
    a, b = node.srcs
    swapped = matmul(_transpose(b), _transpose(a))
    if not _split_k_one(swapped, keep):
        return False
    node.op, node.srcs, node.arg = "permute", (swapped,), _swap(len(node.shape))
    return True


def _swap(nd: int) -> tuple[int, ...]:
    """The permutation of `nd` axes that swaps the last two (a matrix transpose)."""
    return (*range(nd - 2), nd - 1, nd - 2)


def _is_transpose(x: Node) -> bool:
    """True when `x` is a transpose of its source's last two axes."""
    return x.op == "permute" and x.arg == _swap(len(x.shape))


def _swaps_last_two(x: Node) -> bool:
    """True when `x` is a permute that swaps its source's last two axes (whatever it does with the others): a B
    operand stored transposed, such as a linear layer's (N, K) weight read as W^T."""
    return x.op == "permute" and x.arg[-2:] == _swap(len(x.shape))[-2:]


def _transpose(x: Node) -> Node:
    """`x` with its last two axes swapped, undoing a transpose rather than stacking a second one."""
    return x.srcs[0] if _is_transpose(x) else permute(x, _swap(len(x.shape)))


def _split_k_one(node: Node, keep: set[int]) -> bool:
    """`_split_k` for one single product `node`; True when it was rewritten."""
    a, b = node.srcs
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    tiles = -(-m // 32) * -(-n // 32)
    vb = strided_view(b, set())
    grad = (min(m, n) >= 64 or k >= SPLIT_K_GRAD_LONG) and _k_contiguous(a, b, vb)
    tiles64 = -(-m // 64) * -(-n // 64)
    weight_in = _input_grad_parts(b, m, k, tiles64)
    if not weight_in and (m < 16 or k < 2 * SPLIT_K_MIN or tiles64 >= (SPLIT_K_GRAD_TARGET if grad else 66)):
        return False
    unit = math.lcm(32, _patch_taps(b) if vb is not None and vb[2][-1] == 1 else 1)
    if weight_in:
        parts = weight_in
    elif grad:
        parts = _wide_grad_parts(m, n, k, unit) or _grad_parts(k, unit, tiles64)
    else:
        splits = [s for s in range(2, 17) if k % (s * unit) == 0 and k // s >= SPLIT_K_MIN]
        parts = _stream_parts(b, m, k, tiles, splits) or next(
            (s for s in splits if s * tiles >= SPLIT_K_TARGET), splits[-1] if splits else 0
        )
    if not parts:
        return _split_k_images(node, keep, tiles)
    kc = k // parts
    pa, pb = permute(reshape(a, (m, parts, kc)), (1, 0, 2)), reshape(b, (parts, kc, n))
    own = set() if strided_view(a, set()) is not None else {a.uid}
    if own:
        # A is a gradient realized for this product (training): its chunks view that buffer (a reshape node of
        # its own, as reshape() would fold it into A's movement chain)
        pa = permute(Node("reshape", (a,), (m, parts, kc), (m, parts, kc), a.dtype, a.device), (1, 0, 2))
    if _swaps_last_two(b):
        # a B stored transposed (a linear layer's weight read as W^T: alexnet's and vgg16's fc layers at batch
        # 64 ran 128 work-groups; a training convolution's patch columns) is chunked along K in that layout
        pb = permute(reshape(b.srcs[0], (n, parts, kc)), (1, 2, 0))
    if strided_view(pa, own) is None or strided_view(pb, set()) is None:
        # a chunk would not be a view (splitting would copy the operand), unless it stays within one image
        return _split_k_images(node, keep, tiles)
    keep |= own
    partial = matmul(pa, pb)
    node.op, node.srcs, node.arg = "reshape", (reduce("sum", partial, (0,)),), node.shape
    return True


def _grad_parts(k: int, unit: int, tiles64: int) -> int:
    """The K chunks of a weight gradient: the fewest (chunks of `unit`, each at least SPLIT_K_GRAD_MIN long) that
    make SPLIT_K_GRAD_TARGET tiles of 64x64, else the most such chunks. Where those make under half the target,
    chunks down to half that length may reach it: alexnet b64's 13x13 layers (K = 64 x 169) split only in two
    chunks of 5408 (324-432 tiles, 0.35-0.66 ms at 27-30 TFLOP/s on an H100), in 13 chunks of 832 they ran
    0.35-0.50 ms at 37-39; its first layer's 121 chunks (726 tiles) ran 0.283 ms, 242 of half the length 0.301."""
    splits = [s for s in range(2, SPLIT_K_GRAD_MAX + 1) if k % (s * unit) == 0 and k // s >= SPLIT_K_GRAD_MIN]
    parts = next((s for s in splits if s * tiles64 >= SPLIT_K_GRAD_TARGET), splits[-1] if splits else 0)
    if parts * tiles64 >= SPLIT_K_GRAD_TARGET // 2:
        return parts
    short = [s for s in range(2, SPLIT_K_GRAD_MAX + 1) if k % (s * unit) == 0 and k // s >= SPLIT_K_GRAD_MIN // 2]
    return next((s for s in short if s * tiles64 >= SPLIT_K_GRAD_TARGET), parts)


def _wide_grad_parts(m: int, n: int, k: int, unit: int) -> int:
    """The K chunks of a wide weight gradient (SPLIT_K_WIDE_ROWS x SPLIT_K_WIDE_COLS outputs or more) for 128x128
    tiles: the fewest chunks of `unit`, each at least SPLIT_K_WIDE_MIN long, that make SPLIT_K_GRAD_TARGET such
    tiles; 0 where the product is narrower or no such split exists (then `_grad_parts` decides)."""
    if m < SPLIT_K_WIDE_ROWS or n < SPLIT_K_WIDE_COLS:
        return 0
    tiles128 = -(-m // 128) * -(-n // 128)
    splits = [s for s in range(2, SPLIT_K_GRAD_MAX + 1) if k % (s * unit) == 0 and k // s >= SPLIT_K_WIDE_MIN]
    return next((s for s in splits if s * tiles128 >= SPLIT_K_GRAD_TARGET), 0)


def _k_contiguous(a: Node, b: Node, vb: tuple[Node, int, tuple[int, ...]] | None) -> bool:
    """True for a convolution's weight gradient: A is the transposed output gradient (no view of anything: it is
    realized (M, K) for the product) and B is read contiguous along K (patch columns or the input, transposed).
    Such products have few outputs and a K of images x positions, so they split into many chunks. A linear
    layer's products read views on both sides and keep the batch-1 rule."""
    b_k = (vb is not None and vb[2][-2] == 1) or _swaps_last_two(b)
    return b_k and strided_view(a, set()) is None


def _input_grad_parts(b: Node, m: int, k: int, tiles64: int) -> int:
    """The K split of a linear layer's input gradient `dy @ W` at a batch of at most 64 rows (B: its stored
    (N, K) weight read in place, K = the layer's outputs): the fewest chunks of at least STREAM_GRAD_MIN_K that make
    SPLIT_K_GRAD_TARGET 64x64 tiles, else the most; 0 for any other product. On an H100 alexnet b64's fc6
    `64x9216x4096` ran 0.249 ms unsplit, 0.190 / 0.163 / 0.148 ms in 2 / 4 / 8 chunks, and fc7's `64x4096x4096`
    0.089 ms in the 2 chunks of the batch-1 rule, 0.073 in 8 (benchmarks/sweep_step_gemms.py)."""
    if m > 64 or m < 16 or not b.realized or b.op == "permute" or k < 2 * STREAM_GRAD_MIN_K:
        return 0
    splits = [s for s in range(2, 17) if k % (s * 32) == 0 and k // s >= STREAM_GRAD_MIN_K]
    return next((s for s in splits if s * tiles64 >= SPLIT_K_GRAD_TARGET), splits[-1] if splits else 0)


def _stream_parts(b: Node, m: int, k: int, tiles: int, splits: list[int]) -> int:
    """The K split of a linear layer's product at a batch of at most 64 rows (B: its stored (N, K) weight read as
    W^T), which reads every weight once and is bound by how many loads are in flight: the first of `splits` with
    K chunks of at most STREAM_SPLIT_MAX_K that makes STREAM_SPLIT_TARGET 32x32 tiles; 0 for any other product."""
    if m > 64 or not splits or not _swaps_last_two(b) or not b.srcs[0].realized:
        return 0
    fits = [s for s in splits if k // s <= STREAM_SPLIT_MAX_K] or splits
    return next((s for s in fits if s * tiles >= STREAM_SPLIT_TARGET), fits[-1])


def _split_k_images(node: Node, keep: set[int], tiles: int) -> bool:
    """Split the weight gradient of a folded 1x1 convolution (A: the realized output gradient (Cout, N*P), B: the
    NCHW input read as (N*P, Cin)) into chunks within one image: no chunk spanning images is a view of B, so at
    batch 64 these products (mobilenet_v2's 16 x 32 outputs over K = 64 x 112 x 112) ran unsplit on one or a few
    work-groups. The partial products form a batch of (images, S) GEMMs with K = P / S (S the fewest parts of an
    image's positions that bring them to SPLIT_K_TARGET work-groups), summed over both batch axes."""
    a, b = node.srcs
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if not _swaps_last_two(b) or b.srcs[0].op != "reshape" or strided_view(a, set()) is not None:
        return False
    src = b.srcs[0].srcs[0]
    dims = [d for d in src.shape if d != 1]
    view = strided_view(src, set())
    if len(dims) != 3 or dims[0] != n or dims[1] * dims[2] != k or view is None or view[1] != 0:
        return False
    images, p = dims[1], dims[2]
    root = view[0]
    if root.size != k * n or [s for d, s in zip(src.shape, view[2], strict=True) if d != 1] != [p, n * p, 1]:
        return False  # B is not an NCHW buffer read in place
    fits = [s for s in range(1, p + 1) if p % s == 0 and (s == 1 or p // s % 32 == 0) and p // s >= SPLIT_K_MIN]
    if not fits and p >= SPLIT_K_IMAGE_MIN:
        fits = [1]  # one chunk per image (14x14 layers: 196 positions)
    if not fits:
        return False
    parts = next((s for s in fits if images * s * tiles >= SPLIT_K_TARGET), fits[-1])
    kc = p // parts
    a4 = Node("reshape", (a,), (m, images, parts, kc), (m, images, parts, kc), a.dtype, a.device)
    pa = permute(a4, (1, 2, 0, 3))
    pb = permute(reshape(root, (images, n, parts, kc)), (0, 2, 3, 1))
    if strided_view(pa, {a.uid}) is None or strided_view(pb, set()) is None:
        return False
    keep.add(a.uid)
    node.op, node.srcs, node.arg = "reshape", (reduce("sum", matmul(pa, pb), (0, 1)),), node.shape
    return True


def strided_view(node: Node, realize: set[int]) -> tuple[Node, int, tuple[int, ...]] | None:
    """(root, offset, strides) when node is a strided view of a buffer root, else None."""
    if node.realized or node.uid in realize or kind(node) != "movement":
        return node, 0, strides_of(node.shape)
    sub = strided_view(node.srcs[0], realize)
    if sub is None:
        return None
    root, off, st = sub
    src = node.srcs[0]
    if node.op == "permute":
        return root, off, tuple(st[p] for p in node.arg)
    if node.op == "expand":
        return root, off, tuple(0 if a != b else s for a, b, s in zip(src.shape, node.shape, st, strict=True))
    if node.op == "shrink":
        off += sum(a * s for (a, _, _), s in zip(node.arg, st, strict=True))
        return root, off, tuple(s * t for (_, _, t), s in zip(node.arg, st, strict=True))
    if node.op == "reshape":
        kept = [(d, s) for d, s in zip(src.shape, st, strict=True) if d != 1]
        if [d for d, _ in kept] == [d for d in node.shape if d != 1]:
            it = iter(s for _, s in kept)
            return root, off, tuple(next(it) if d != 1 else 0 for d in node.shape)
        if st == strides_of(src.shape):
            return root, off, strides_of(node.shape)
    return None


def _identity_view(node: Node, realize: set[int]) -> Node | None:
    """The buffer that `node`, a chain of views, reads in its own row-major order, or None. A weight gradient's
    chunk sum reaches the parameter's shape through a reshape, a permute and its inverse and another reshape:
    on OpenCL each such chain was a copy kernel (alexnet's step: seven launches for its weights and biases)."""
    view = strided_view(node, realize)
    if view is None:
        return None
    root, off, st = view
    if root is node or off or root.size != node.size or not (root.realized or root.uid in realize):
        return None
    dense = strides_of(node.shape)
    return root if all(s == w for d, s, w in zip(node.shape, st, dense, strict=True) if d != 1) else None


def _batch_layout(
    shape: tuple[int, ...], views: list[tuple[int, tuple[int, ...]]]
) -> tuple[int, int, list[tuple[int, int]]] | None:
    """Fold the batch dims of both GEMM operands into at most two (outer, inner) dims with one stride each.

    Adjacent dims merge when every operand (and the contiguous output) can step over both with one stride.
    Returns (batch, inner, [(outer stride, inner stride) per operand]), or None when more than two dims remain.
    """
    dims = [i for i, d in enumerate(shape) if d != 1]
    groups: list[list[int]] = []
    for i in dims:
        if groups and all(st[groups[-1][-1]] == shape[i] * st[i] for _, st in views):
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) > 2:
        return None
    sizes = [math.prod(shape[i] for i in g) for g in groups]
    strides = [[st[g[-1]] for g in groups] for _, st in views]
    while len(sizes) < 2:
        sizes.insert(0, 1)
        for s in strides:
            s.insert(0, 0)
    return sizes[0] * sizes[1], sizes[1], [(s[0], s[1]) for s in strides]


def _gemm_plan(n: Node, realize: set[int]) -> tuple[Node, Node, GemmSpec]:
    """The buffers and strided layout a GEMM reads; operands that are not strided views get realized first."""
    while True:
        views = [strided_view(x, realize) for x in n.srcs]
        for x, v in zip(n.srcs, views, strict=True):
            if v is None:
                realize.add(x.uid)
        if any(v is None for v in views):
            continue
        a_view, b_view = views
        assert a_view is not None and b_view is not None
        layout = _batch_layout(n.shape[:-2], [(a_view[1], a_view[2][:-2]), (b_view[1], b_view[2][:-2])])
        if layout is None:
            realize.update(x.uid for x in n.srcs)
            continue
        batch, inner, ((sab, sai), (sbb, sbi)) = layout
        (a, ao, ast), (b, bo, bst) = a_view, b_view
        realize.update(root.uid for root in (a, b) if not root.realized)
        m, kk, nn = n.srcs[0].shape[-2], n.srcs[0].shape[-1], n.shape[-1]
        spec = GemmSpec(batch, m, nn, kk, (ao, sab, ast[-2], ast[-1]), (bo, sbb, bst[-2], bst[-1]), inner, sai, sbi)
        return a, b, spec


def _implicit_conv(plan: tuple[Node, Node, GemmSpec], span_ok: bool) -> tuple[Node, Node, GemmSpec] | None:
    """The plan of GEMM `plan` gathering its B operand, an im2col's patch columns, from the image instead (None
    where its layout does not allow it). The columns may be per image (N, C*kh*kw, OH*OW) or have the batch folded
    in (C*kh*kw, N, OH*OW): then one product's columns run over every image's output positions, where the device's
    GEMM can find each column's image (`span_ok`). Whether the columns go unmade is `_implicit_convs`' decision."""
    a, b, spec = plan
    win: Window = b.arg
    depthwise = spec.m == 1 and spec.k == win.kh * win.kw and spec.a[3] == 1
    if spec.m <= 4 and not depthwise:
        return None
    plane = win.oh * win.ow
    bo, sbb, sbk, sbn = spec.b
    span = win.n if span_ok and sbk == win.n * plane and spec.n == win.n * plane else 1  # images along the columns
    per_row = win.kh * win.kw * plane * span
    strides = (sbb, spec.b_inner)
    if bo or sbn != 1 or sbk != plane * span or spec.k % (win.kh * win.kw) or any(s % per_row for s in strides):
        return None
    sbb, sbi = (s // per_row * win.h * win.w for s in strides)
    conv = GemmSpec(spec.batch, spec.m, spec.n, spec.k, spec.a, (0, sbb, 0, 0), spec.inner, spec.a_inner, sbi, win)
    return a, b.srcs[0], conv


def _implicit_wgrad(plan: tuple[Node, Node, GemmSpec]) -> tuple[Node, Node, GemmSpec] | None:
    """The plan of a weight-gradient GEMM (dy @ columns^T, or a K chunk of it: B the transposed folded patch
    columns, read along K = images x positions) gathering B from the image (a `conv_t` spec), or None where B is
    not such a view: every batch entry's columns must lie within the columns' rows and each k run within a row."""
    a, b, spec = plan
    win: Window = b.arg
    span, rows = win.n * win.oh * win.ow, win.c * win.kh * win.kw
    _, _, sbk, sbn = spec.b
    if not win.fold or sbk != 1 or sbn != span or win.n * win.c * win.h * win.w >= 2**31 or span >= 2**31:
        return None
    if not _runs_within([spec.b_at(bz) for bz in range(spec.batch)], spec.k, spec.n, span, rows):
        return None
    t = GemmSpec(spec.batch, spec.m, spec.n, spec.k, spec.a, spec.b, spec.inner, spec.a_inner, spec.b_inner, None, win)
    return a, b.srcs[0], t


def _implicit_convs(
    order: list[Node],
    gemm_ops: dict[int, tuple[Node, Node, GemmSpec]],
    realize: set[int],
    outputs: set[int],
    span_ok: bool,
) -> None:
    """Let GEMMs gather patch columns from the image instead of reading an im2col buffer: a convolution's product
    (B: the columns) and, with `span_ok`, a training convolution's weight gradient (B: the folded columns
    transposed, `_implicit_wgrad`). An im2col is left unmade only when every kernel that reads it gathers; then no
    patch buffer is written and read (vgg16's training step at batch 64 on an H100: 18.3 ms of im2col kernels,
    which wrote ~21 GB of columns). Otherwise every reader keeps reading the buffer."""
    readers: dict[int, list[Node]] = {}
    for n in order:
        for s in n.srcs:
            readers.setdefault(s.uid, []).append(n)
    gathers: dict[int, tuple[Node, dict[int, tuple[Node, Node, GemmSpec]]]] = {}
    for n in order:
        if n.op != "matmul":
            continue
        b = gemm_ops[n.uid][1]
        if b.realized or b.op != "im2col" or b.uid in outputs:
            continue
        plan = _implicit_conv(gemm_ops[n.uid], span_ok) or (_implicit_wgrad(gemm_ops[n.uid]) if span_ok else None)
        if plan is not None:
            gathers.setdefault(b.uid, (b, {}))[1][n.uid] = plan
    for cols, plans in gathers.values():
        if _readers_through_views(cols, readers, realize) <= plans.keys():
            realize.discard(cols.uid)
            gemm_ops.update(plans)


def _output_gradients_in_place(
    order: list[Node], gemm_ops: dict[int, tuple[Node, Node, GemmSpec]], realize: set[int]
) -> None:
    """Let weight-gradient GEMMs read a folded convolution's output gradient dy (C, N*P) in place from the NCHW
    buffer it permutes (`GemmSpec.a_nchw`) instead of a copy in that layout: the input gradient (or batch norm's
    backward) already reads dy as NCHW, so op by op the gradient was written twice (vgg16 b64 on an H100: 1.64 ms
    for the two 224x224 layers' copies, 0.9 ms each, beside the NCHW ones). Only where every kernel reading the
    copy is such a GEMM with rows for the tiled templates; an NCHW dy that was not a buffer becomes one."""
    from plait.codegen.gemm_small import MAX_ROWS

    readers: dict[int, list[Node]] = {}
    for n in order:
        for s in n.srcs:
            readers.setdefault(s.uid, []).append(n)
    by_a: dict[int, list[int]] = {}
    for uid, (a, _, _) in gemm_ops.items():
        by_a.setdefault(a.uid, []).append(uid)
    for users in by_a.values():
        a = gemm_ops[users[0]][0]
        x = _nchw_source(a)
        if x is None or a.realized or _readers_through_views(a, readers, realize) != set(users):
            continue
        images, c, h, w = x.shape
        plane, span = h * w, images * h * w
        specs = [gemm_ops[u][2] for u in users]
        if not all(
            sp.m > MAX_ROWS
            and sp.a[2:] == (span, 1)
            and _runs_within([sp.a_at(bz) for bz in range(sp.batch)], sp.k, sp.m, span, c)
            for sp in specs
        ):
            continue
        maybe = [_nchw_spec(sp, plane, c * plane, span) for sp in specs]
        in_place = [sp for sp in maybe if sp is not None]
        if len(in_place) < len(specs):
            continue
        view = strided_view(x, realize)
        root = x
        if view is not None and view[1] == 0 and view[0].size == x.size:
            dense = zip(x.shape, view[2], strides_of(x.shape), strict=True)
            root = view[0] if all(s == t for d, s, t in dense if d != 1) else x
        if root is x and not x.realized:
            realize.add(x.uid)
        realize.discard(a.uid)
        for u, sp in zip(users, in_place, strict=True):
            gemm_ops[u] = (root, gemm_ops[u][1], sp)


def _nchw_source(a: Node) -> Node | None:
    """The NCHW node x when `a` is x.permute(1, 0, 2, 3) reshaped to (..., N*H*W) rows of its C channels (a folded
    convolution's output gradient as its weight gradient reads it), else None."""
    p = a.srcs[0] if a.op == "reshape" else None
    if p is None or p.op != "permute" or p.arg != (1, 0, 2, 3):
        return None
    x = p.srcs[0]
    n, c, h, w = x.shape
    return x if a.shape[-1] == n * h * w and math.prod(a.shape[:-1]) == c else None


def _nchw_spec(spec: GemmSpec, plane: int, image: int, span: int) -> GemmSpec | None:
    """`spec` reading its A from the NCHW buffer: a strided view (`_nchw_view`), else gathered across images
    (`a_nchw`), except in the products that take 128x128 tiles (`tune._wide_weight_gradient`): there the gather,
    one float per load, cost more than the copy it saves (vgg16 b64 on an H100: `32x256x2304x6272` 4.92 -> 5.70 ms,
    `8x512x4608x6272` 4.89 -> 5.56, against copies of 51M and 26M floats); None then."""
    from plait.tune import _wide_weight_gradient

    plain = _nchw_view(spec, plane, image, span)
    if plain is not None:
        return plain
    return None if _wide_weight_gradient(spec) else replace(spec, a_nchw=(plane, image))


def _nchw_view(spec: GemmSpec, plane: int, image: int, span: int) -> GemmSpec | None:
    """`spec` reading its A, rows of the (C, N*P) layout, as a strided view of the NCHW buffer, where each batch
    entry's K run stays within one image's plane (a 1x1 weight gradient's chunks within images,
    `_split_k_images`) and the entries' offsets stay affine in the two batch indices; else None."""

    def at(off: int) -> int:
        row, pos = divmod(off, span)
        return pos // plane * image + row * plane + pos % plane

    ao, sab, _, _ = spec.a
    outer = spec.batch // spec.inner
    base = at(ao)
    s_out = at(ao + sab) - base if outer > 1 else 0
    s_in = at(ao + spec.a_inner) - base if spec.inner > 1 else 0
    for bz in range(spec.batch):
        off = spec.a_at(bz)
        if off % span % plane + spec.k > plane or at(off) != base + bz // spec.inner * s_out + bz % spec.inner * s_in:
            return None
    return replace(spec, a=(base, s_out, plane, 1), a_inner=s_in)


def _runs_within(starts: list[int], k: int, width: int, span: int, rows: int) -> bool:
    """True when each batch entry of an operand in a (rows, span) layout, starting at its offset in `starts`, stays
    inside: its first (row, position) plus `width` rows and `k` positions (a product's A: M rows; B: N)."""
    for start in starts:
        row0, pos0 = divmod(start, span)
        if pos0 + k > span or row0 + width > rows:
            return False
    return True


def _readers_through_views(node: Node, readers: dict[int, list[Node]], realize: set[int]) -> set[int]:
    """The kernels that read `node`'s buffer: its readers, looking through movement nodes that are not buffers."""
    out: set[int] = set()
    stack = [node]
    while stack:
        for r in readers.get(stack.pop().uid, []):
            if kind(r) == "movement" and r.uid not in realize:
                stack.append(r)
            else:
                out.add(r.uid)
    return out


def _wgrad_gather_form(order: list[Node]) -> bool:
    """Write a weight gradient (folded columns @ dy^T)^T as dy @ columns^T, so that the columns are its B operand,
    which `_implicit_wgrad` can gather from the image, and `_split_k` splits it by the weight-gradient rule (it
    swaps only products whose K is the longest side: resnet50's 512 x 4608 over K 3136 had stayed whole, 0.47-0.51
    ms at 29-31 TFLOP/s on an H100 against 36 for its split peers). The product comes out in the weight's layout."""
    changed = False
    for node in order:
        if node.op != "matmul" or node.realized or math.prod(node.shape[:-2]) != 1 or not _is_transpose(node.srcs[1]):
            continue
        view = strided_view(node.srcs[0], set())
        root = view[0] if view is not None else None
        if root is None or root.op != "im2col" or root.realized or not root.arg.fold:
            continue
        a, b = node.srcs
        node.op, node.srcs, node.arg = "permute", (matmul(_transpose(b), _transpose(a)),), _swap(len(node.shape))
        changed = True
    return changed


def schedule(
    outputs: list[Node],
    split_parts: int,
    implicit_conv: bool = False,
    split_k: bool = False,
    winograd: bool = False,
    winograd_cl: bool = False,
    conv_span: bool = False,
    constants_once: bool = False,
) -> list[Item]:
    """Kernel items for `outputs`. With `implicit_conv` (devices whose GEMM can gather patches itself), a GEMM
    that is the only reader of an im2col reads the image directly and the patch buffer is never made. With
    `split_k` (devices with many cores and no other way to fill them), few-tile products split their K. With
    `winograd` (the C device), 3x3 stride-1 implicit convolutions where Winograd's algorithm wins run with it;
    `constants_once` says the plan runs kernels that read only leaf buffers once, when it is built. `winograd_cl`
    does the same for OpenCL with the batched GEMM (plait/codegen/winograd_cl.py).
    With `conv_span` (OpenCL) a GEMM also gathers patch columns that have the batch folded in."""
    order = toposort(outputs)
    if _split_reductions(order, split_parts):
        order = toposort(outputs)
    if implicit_conv and conv_span and _wgrad_gather_form(order):
        order = toposort(outputs)
    keep: set[int] = set()
    if split_k and _split_k(order, keep):
        order = toposort(outputs)
    realize: set[int] = {n.uid for n in outputs} | keep
    users: dict[int, int] = {}
    for n in order:
        for s in n.srcs:
            users[s.uid] = users.get(s.uid, 0) + 1
    cost: dict[int, int] = {}
    shared = _shared_by_reductions(order)
    wide = split_parts >= SPLIT_WIDE_PARTS  # devices with cores to spare recompute cheap shared expressions
    pooled = _pool_inputs_inline(order, users, {n.uid for n in outputs}) if wide else set()
    gemm_ops: dict[int, tuple[Node, Node, GemmSpec]] = {}
    for n in order:
        k = kind(n)
        if k == "leaf":  # a buffer already (its recorded sources stay in autograd graphs): costs nothing to read
            cost[n.uid] = 0
            continue
        if k in ("reduce", "matmul", "contract", "custom"):
            realize.add(n.uid)
        if k == "custom":
            realize.update(s.uid for s in n.srcs if not s.realized and s.uid not in pooled)
        c = OPS[n.op].cost if k == "elementwise" else 0
        c += sum(cost.get(s.uid, 0) for s in n.srcs if s.uid not in realize)
        cost[n.uid] = c
        recompute = wide and k == "elementwise" and c <= PLANE_RECOMPUTE_COST and _planes_read(n, realize) <= 1
        if k == "elementwise" and (c > MAX_INLINE_COST or (users.get(n.uid, 0) > 1 and c > SHARED_INLINE_COST)):
            if not recompute:
                realize.add(n.uid)
        elif k == "elementwise" and c >= REDUCED_SHARED_COST and n.uid in shared and not recompute:
            realize.add(n.uid)
        if n.op == "expand" and cost.get(n.srcs[0].uid, 0) > 2 and n.srcs[0].uid not in realize:
            realize.add(n.srcs[0].uid)
    if winograd and constants_once and SHORTCUT_AFFINES:
        realize |= _branch_affines(order, users)
    for n in order:
        if n.op == "matmul":
            gemm_ops[n.uid] = _gemm_plan(n, realize)
    if implicit_conv:
        _implicit_convs(order, gemm_ops, realize, {n.uid for n in outputs}, conv_span)
        if conv_span:
            _output_gradients_in_place(order, gemm_ops, realize)
    items: list[Item] = []
    for n in order:
        if n.uid not in realize:
            continue
        if n.op == "matmul":
            a, b, spec = gemm_ops[n.uid]
            items.append(Item(n, [a, b], "gemm", gemm=spec))
            continue
        if n.op == "reshape" and (n.srcs[0].realized or n.srcs[0].uid in realize):
            items.append(Item(n, [n.srcs[0]], "alias"))  # a contiguous buffer viewed in another shape: no copy
            continue
        if wide and n.op == "reshape" and (root := _identity_view(n.srcs[0], realize)) is not None:
            items.append(Item(n, [root], "alias"))
            continue
        inputs = _boundary(n.srcs, realize)
        k = kind(n)
        items.append(Item(n, inputs, k if k in ("reduce", "custom", "contract") else "elementwise"))
    items = _fuse_epilogues(items, users, {n.uid for n in outputs})
    if constants_once:
        _mark_constants(items)
    if split_parts >= SPLIT_WIDE_PARTS:
        items = _chunk_sums_inline(items, users, {n.uid for n in outputs})
        items = _merge_final_writes(items, {n.uid for n in outputs})
    items = _winograd_cl(items, constants_once) if winograd_cl else items
    items = _pool_max_with_offsets(items)
    if winograd and constants_once:  # the C device, where a plan's constant work runs once
        from plait.schedule import irblock  # (it builds Items)

        items = irblock.fuse(_pointwise_lanes(_conv_s2(items)), {n.uid for n in outputs})
        items = _stem_pool(items, {n.uid for n in outputs})
    if winograd and constants_once:
        return _packed_gemm(_winograd(items, constants_once))
    return _winograd(items, constants_once) if winograd else items


# The C device's inference plans store a shortcut's batch norm with its own product where two branches meet
# (_branch_affines); measured in docs/benchmarks.md (seventeenth session).
SHORTCUT_AFFINES = True


def _product_affine(n: Node, users: dict[int, int]) -> bool:
    """Whether `n` is a per-channel affine of a product that only it reads: product (through reshapes) times a
    broadcast vector, plus a broadcast vector (an inference batch norm after a convolution)."""
    if n.op != "add" or users.get(n.uid, 0) != 1:
        return False
    mul = next((s for s in n.srcs if s.op == "mul"), None)
    if mul is None or users.get(mul.uid, 0) != 1 or not any(s.op == "expand" for s in n.srcs if s is not mul):
        return False
    x = next((s for s in mul.srcs if s.op != "expand"), None)
    if x is None or not any(s.op == "expand" for s in mul.srcs if s is not x):
        return False
    while x.op == "reshape" and not x.realized and users.get(x.uid, 0) == 1:
        x = x.srcs[0]
    return x.op == "matmul" and not x.realized and users.get(x.uid, 0) == 1


def _branch_affines(order: list[Node], users: dict[int, int]) -> set[int]:
    """Where two products meet at an add, each through its own per-channel affine (resnet's downsampling blocks at
    inference: the main branch's and the shortcut's batch norms), the second branch's affine, to be stored by its own
    product (its epilogue). The add then reads it as a plain residual, which the first product carries in C
    (gemm.carried_residual takes a residual only unscaled); inlined, the shortcut's raw product was read again beside
    C and scaled in the epilogue."""
    out: set[int] = set()
    for n in order:
        if n.op == "add" and len(n.srcs) == 2 and all(_product_affine(s, users) for s in n.srcs):
            out.add(n.srcs[1].uid)
    return out


def _packed_gemm(items: list[Item]) -> list[Item]:
    """Give each C GEMM whose weight (A) is constant in the plan (a parameter, an ONNX initializer, or one that
    constant items make) that weight packed in its register tile's order (gemm_c.APack) by an item marked
    `constant`, which runs once when the plan is built; the product reads the packed panels. Products that do not
    run on the GEMM library untransposed with A shared by the batch (gemm.packed_tile) read A where it lies."""
    made_once = _made_once(items)
    out: list[Item] = []
    for it in items:
        weight = it.inputs[0] if it.inputs else None
        tile = packed_tile(it.gemm) if it.kind == "gemm" and it.gemm is not None else None
        if tile is None or not _constant(weight, made_once):
            out.append(it)
            continue
        assert it.gemm is not None
        ao, _, sam, sak = it.gemm.a
        plan = gemm_c.APack(it.gemm.m, it.gemm.k, tile[0], tile[1], (ao, sam, sak))
        packed = pointwise_weight(weight, plan)
        out.append(Item(packed, [weight], "custom", extra={"constant": True}))
        out.append(Item(it.out, [packed, *it.inputs[1:]], "gemm", gemm=it.gemm, extra={**it.extra, "apack": plan}))
    return out


def _made_once(items: list[Item]) -> set[int]:
    """The outputs of items marked `constant` (work done once at plan build, e.g. a weight with batch norm folded in)."""
    return {it.out.uid for it in items if it.extra.get("constant")}


def _constant(weight: Node | None, made_once: set[int]) -> TypeGuard[Node]:
    """Whether `weight` is constant in the plan: a buffer of its own (a parameter, an ONNX initializer) or the output
    of an item marked `constant` (`made_once`, from _made_once)."""
    return weight is not None and (weight.buffer is not None or weight.uid in made_once)


def _packed_lanes(it: Item, plan: pointwise_c.LanesPlan) -> list[Item]:
    """Product item `it` as a `pointwise` item reading its weight packed for `plan` (the GEMM's fused epilogue kept),
    after the `constant` item that packs the weight once at plan build."""
    packed = pointwise_weight(it.inputs[0], plan)
    return [
        Item(packed, [it.inputs[0]], "custom", extra={"constant": True}),
        Item(it.out, [packed, *it.inputs[1:]], "pointwise", gemm=it.gemm, extra={**it.extra, "lanes": plan}),
    ]


def _conv_s2(items: list[Item]) -> list[Item]:
    """Run each stride-2 3x3 convolution (conv_s2_c.fits) whose weight is constant in the plan (a parameter, an ONNX
    initializer, or one that constant items make, e.g. with batch norm folded in) with the output channels across
    the lanes (plait/codegen/conv_s2_c.py): its weights are packed by an item marked `constant` and the product
    becomes a `pointwise` item over the image (the GEMM's fused epilogue kept). Other weights keep the GEMM."""
    made_once = _made_once(items)
    out: list[Item] = []
    for it in items:
        weight = it.inputs[0] if it.inputs else None
        fits = it.kind == "gemm" and it.gemm is not None and conv_s2_c.fits(it.gemm)
        if not fits or not _constant(weight, made_once):
            out.append(it)
            continue
        assert it.gemm is not None
        out.extend(_packed_lanes(it, conv_s2_c.plan(it.gemm)))
    return out


def _stem_pool(items: list[Item], outputs: set[int]) -> list[Item]:
    """Fuse each image stem in the lanes form with the max pool that alone reads it (stem_pool_c.fits) into one
    `stempool` item writing the pooled output (plait/codegen/stem_pool_c.py): the stem's output never goes to
    memory. The stem's product and epilogue travel in extra["stempool"]. A weight constant in the plan (as
    _conv_s2's) is packed by an item marked `constant`, once at plan build, instead of per call and thread."""
    made_once = _made_once(items)
    packs: dict[int, Item] = {}
    readers: dict[int, int] = {}
    for it in items:
        for x in it.inputs:
            readers[x.uid] = readers.get(x.uid, 0) + 1
    stems = {it.out.uid: i for i, it in enumerate(items) if it.kind == "gemm" and it.gemm is not None}
    fused: dict[int, Item] = {}
    for it in items:
        if it.kind != "custom" or it.out.op != "max_pool2d" or it.inputs[0].uid not in stems:
            continue
        i = stems[it.inputs[0].uid]
        stem = items[i]
        assert stem.gemm is not None
        if readers.get(stem.out.uid) != 1 or stem.out.uid in outputs:
            continue
        if not stem_pool_c.fits(stem.gemm, stem.epilogue(), it.out.arg):
            continue
        weight, inputs = stem.inputs[0], list(stem.inputs)
        once = _constant(weight, made_once)
        if once and stem_pool_c.packable(stem.gemm):
            packed = pointwise_weight(weight, stem_pool_c.pack_plan(stem.gemm))
            packs[i] = Item(packed, [weight], "custom", extra={"constant": True})
            inputs[0] = packed
        sp = stem_pool_c.StemPool(stem.gemm, stem.epilogue(), it.out.arg, i in packs)
        fused[i] = Item(it.out, inputs, "stempool", gemm=stem.gemm, extra={"stempool": sp})
    out: list[Item] = []
    pools = {f.out.uid for f in fused.values()}
    for i, it in enumerate(items):
        if i in fused:
            out.extend([packs[i], fused[i]] if i in packs else [fused[i]])
        elif not (it.kind == "custom" and it.out.uid in pools):
            out.append(it)
    return out


def _pointwise_lanes(items: list[Item]) -> list[Item]:
    """Run each 1x1 convolution over a narrow plane whose weight is a buffer of its own (a model parameter, an ONNX
    initializer) with the output channels across the vector lanes (plait/codegen/pointwise_c.py): its weights are
    packed by an item marked `constant`, which runs once when the plan is built, and the product becomes a
    `pointwise` item that reads the packed panels (with the GEMM's fused epilogue). A weight computed per replay
    keeps the GEMM, which reads it where it lies."""
    out: list[Item] = []
    for it in items:
        weight = it.inputs[0] if it.inputs else None
        if it.kind != "gemm" or it.gemm is None or weight is None or weight.buffer is None:
            out.append(it)
            continue
        if not pointwise_c.lanes_fits(it.gemm):
            out.append(it)
            continue
        out.extend(_packed_lanes(it, pointwise_c.lanes_plan(it.gemm)))
    return out


def _pool_inputs_inline(order: list[Node], users: dict[int, int], outputs: set[int]) -> set[int]:
    """The float32 elementwise inputs of OpenCL max pools under autograd that only the pool's offsets and output
    read (a convolution's bias and ReLU, read from its (C, N, H*W) product): left unmade, the offsets' kernel, which
    also writes the output (`_pool_max_with_offsets`), computes them at each tap it reads. alexnet b64's ReLU passes
    before its three pools took 0.11 ms of its step on an H100 and wrote 100 MB that only the pools read."""
    takes = {n.srcs[1].uid: n for n in order if n.op == "max_pool2d_take_cl"}
    inline: set[int] = set()
    for n in order:
        x = n.srcs[0] if n.op == "max_pool2d_argmax_cl" else None
        take = takes.get(n.uid)
        if x is None or take is None or take.srcs[0] is not x or x.realized or x.uid in outputs:
            continue
        if kind(x) == "elementwise" and x.dtype == dtypes.float32 and users.get(x.uid) == 2:
            inline.add(x.uid)
    return inline


def _pool_max_with_offsets(items: list[Item]) -> list[Item]:
    """OpenCL max pooling under autograd (plait/graph/ops/pool_cl.py): the kernel that finds each window's maximum's
    offset also writes the maximum, so the pooled output needs no gather pass of its own. The output becomes a
    "written" buffer that the offsets' kernel fills, listed first among its inputs (alexnet's three pools and
    resnet's stem: one launch and one pass over the offsets each; resnet18 b64's `POOLTAKE` took 0.11 ms on an
    H100)."""
    offsets = {it.out.uid: i for i, it in enumerate(items) if it.out.op == "max_pool2d_argmax_cl" and not it.extra}
    merged: dict[int, Item] = {}
    taken: set[int] = set()
    for i, it in enumerate(items):
        j = offsets.get(it.out.srcs[1].uid, -1) if it.out.op == "max_pool2d_take_cl" else -1
        if j < 0 or j in merged or items[j].out.srcs[0] is not it.out.srcs[0]:
            continue
        merged[j] = Item(items[j].out, [it.out, *items[j].inputs], "custom", extra={"writes": [it.out]})
        taken.add(i)
    out: list[Item] = []
    for i, it in enumerate(items):
        if i in merged:
            out += [Item(merged[i].inputs[0], [], "written"), merged[i]]
        elif i not in taken:
            out.append(it)
    return out


MERGE_WRITES_MAX = 16  # outputs one merged kernel writes at most
MERGE_BUFFERS_MAX = 64  # buffer arguments of a merged kernel at most (OpenCL guarantees 1024 bytes of them)
MERGE_RANGES_MAX = 1 << 22  # outputs this small merge whatever their sizes (one kernel over their concatenation)


def _chunk_sums_inline(items: list[Item], users: dict[int, int], outputs: set[int]) -> list[Item]:
    """A split-K product's chunk sum (an rsum over axis 0 of the S chunks, `_split_k`) that only one elementwise
    kernel reads, element for element, is summed in that kernel instead of a kernel of its own: the fc layers'
    input gradients and their ReLU or dropout masks were a reduce launch and an elementwise launch each (alexnet
    b64 on an H100: ~5 us a launch). The elementwise kernel reads the chunks in place of the sum and adds them in
    the chunk sum's order (OpenCLRenderer.render_elementwise); extra["chunk_sums"] keeps it out of merged writes."""
    readers: dict[int, int] = {}
    for it in items:
        for x in it.inputs:
            readers[x.uid] = readers.get(x.uid, 0) + 1
    sums = {it.out.uid: it for it in items if _is_chunk_sum(it) and it.out.uid not in outputs}
    inlined: set[int] = set()
    out: list[Item] = []
    for it in items:
        if it.kind == "elementwise" and not it.extra and it.out.dtype == dtypes.float32:
            found = [
                m
                for m in it.inputs
                if m.uid in sums
                and readers.get(m.uid) == 1
                and m.size == it.out.size
                and _reads_identically(it.out, m, users)
            ]
            if found:
                inlined.update(m.uid for m in found)
                chunks = {m.uid: m.srcs[0] for m in found}
                inputs = list({(x := chunks.get(m.uid, m)).uid: x for m in it.inputs}.values())
                it = Item(it.out, inputs, "elementwise", extra={"chunk_sums": found})
        out.append(it)
    return [it for it in out if it.out.uid not in inlined]


def _is_chunk_sum(it: Item) -> bool:
    """A float32 sum over axis 0 of a few product chunks that a kernel before it wrote (`_split_k`'s chunk sum)."""
    n = it.out
    if it.kind != "reduce" or n.op != "rsum" or n.arg != (0,) or n.dtype != dtypes.float32 or n.shape[:1] != (1,):
        return False
    src = n.srcs[0]
    return it.inputs == [src] and src.op == "matmul" and src.shape[1:] == n.shape[1:] and src.shape[0] <= MAX_CHUNK_SUM


def _merge_final_writes(items: list[Item], outputs: set[int]) -> list[Item]:
    """On devices where a launch costs more than a small kernel's work (OpenCL on a GPU: ~5 us each), elementwise
    outputs of the same size that no later kernel reads become one kernel writing them all: an optimizer's update
    and batch norm's running statistics were one launch per parameter and statistic (resnet50: ~320 per step, most
    over 64-2048 values). Outputs of up to MERGE_RANGES_MAX values join whatever their sizes, the kernel running
    over their concatenation (alexnet's update: nine launches for its convolution weights and biases). The merged
    kernel takes the last member's place (every member's inputs are ready there, and nothing between reads a
    member's output); the other members stay as "written" items, buffers that kernel fills
    (item.extra["writes"])."""
    last_read: dict[int, int] = {}
    for i, it in enumerate(items):
        for x in it.inputs:
            last_read[x.uid] = i
    groups: dict[tuple[int, str], list[list[int]]] = {}
    for i, it in enumerate(items):
        if (
            it.kind != "elementwise"
            or it.out.uid not in outputs
            or it.out.size == 0
            or it.extra
            or last_read.get(it.out.uid, -1) > i
        ):
            continue
        runs = groups.setdefault((it.out.size if it.out.size > MERGE_RANGES_MAX else 0, it.out.dtype.name), [[]])
        run = runs[-1]
        ins = {x.uid for j in run for x in items[j].inputs} | {x.uid for x in it.inputs}
        if len(run) >= MERGE_WRITES_MAX or len(ins) + len(run) + 1 > MERGE_BUFFERS_MAX:
            runs.append(run := [])
        run.append(i)
    merged: dict[int, Item] = {}  # the last member's index -> the merged kernel
    written: set[int] = set()
    for runs in groups.values():
        for run in runs:
            if len(run) < 2:
                continue
            members = [items[j] for j in run]
            inputs = list({x.uid: x for m in members for x in m.inputs}.values())
            last = members[-1]
            writes = [m.out for m in members[:-1]]
            merged[run[-1]] = Item(last.out, writes + inputs, "elementwise", extra={"writes": writes})
            written.update(run[:-1])
    if not merged:
        return items
    out: list[Item] = []
    for i, it in enumerate(items):
        if i in written:
            continue
        if i in merged:
            m = merged[i]
            out += [Item(w, [], "written") for w in m.extra["writes"]]
            out.append(m)
            continue
        out.append(it)
    return out


def _mark_constants(items: list[Item]) -> None:
    """Mark `constant` the elementwise and reduction items that read only leaf buffers (model parameters) or what
    such items made: a plan with inputs runs them once, when it is built, as it does Winograd weight transforms.
    Batch norm at inference made one per-channel kernel per layer for 1 / sqrt(var + eps) on every replay
    (mobilenet_v2 at batch 64 on an H100: 52 such launches, 0.3 ms of 5.9)."""
    made: set[int] = set()
    for it in items:
        if not it.inputs or not all(n.buffer is not None or n.uid in made for n in it.inputs):
            continue
        if it.kind in ("elementwise", "reduce"):
            it.extra["constant"] = True
            made.add(it.out.uid)
        elif it.kind == "alias":
            made.add(it.out.uid)


def _winograd_cl(items: list[Item], constants_once: bool) -> list[Item]:
    """OpenCL: replace each convolution GEMM that `winograd_cl.pick` chooses by four kernels: the weight transform
    (run once at plan build for a constant weight, as `_winograd` does), the input transform, the 16 products as one
    batched GEMM item (tuned and rendered like any GEMM) and the output transform with the GEMM's fused epilogue.
    A training forward whose weight gradient also runs Winograd (`winograd_cl_wgrad`, which transforms the same
    image tiles) takes that gradient's V instead of making its own: the V item moves up to the forward."""
    shared = {it.inputs[0].uid: i for i, it in enumerate(items) if it.out.op == "winograd_cl_input"}
    moved: set[int] = set()
    out: list[Item] = []
    for i, it in enumerate(items):
        if i in moved:
            continue
        plan = winograd_cl.pick(it.gemm) if it.kind == "gemm" and it.gemm is not None else None
        if plan is None:
            out.append(it)
            continue
        weight, image = it.inputs[:2]
        j = shared.get(image.uid, -1)
        grad_v = items[j].out.arg if j > i and plan.fold else None
        if grad_v is not None and replace(plan, pad=grad_v.pad) == replace(
            grad_v, w_view=plan.w_view, fold=True, parts=1
        ):
            plan = replace(plan, pad=grad_v.pad)
            v = items[j].out
            moved.add(j)
        else:
            v = winograd_cl_input(image, plan)
        u = winograd_cl_weight(weight, plan)
        prod = matmul(u, v)
        out.append(Item(u, [weight], "custom", extra={"constant": constants_once and weight.buffer is not None}))
        out.append(Item(v, [image], "custom"))
        out.append(Item(prod, [u, v], "gemm", gemm=plan.gemm_spec()))
        out.append(Item(it.out, [prod, *it.inputs[2:]], "winograd", extra={**it.extra, "winograd": plan}))
    return out


def _winograd(items: list[Item], constants_once: bool) -> list[Item]:
    """Replace each convolution GEMM that `winograd_c.pick` chooses by a weight transform and a Winograd kernel
    (which keeps the GEMM's fused epilogue). Where the plan runs constant work once, a transform of a weight that
    is a buffer of its own (a model parameter, an ONNX initializer) is marked `constant`: it runs when the plan is
    built, not per replay (so is one of a weight that constant items compute, e.g. BN folded into it); elsewhere
    the transform's cost per call is part of the choice."""
    made_once = _made_once(items)
    out: list[Item] = []
    for it in items:
        if it.kind != "gemm" or it.gemm is None:
            out.append(it)
            continue
        weight = it.inputs[0]
        constant = constants_once and _constant(weight, made_once)
        plan = winograd_c.pick(it.gemm, constant)
        if plan is None:
            out.append(it)
            continue
        u = winograd_weight(weight, plan)
        out.append(Item(u, [weight], "custom", extra={"constant": constant}))
        out.append(Item(it.out, [u, *it.inputs[1:]], "winograd", gemm=it.gemm, extra={**it.extra, "winograd": plan}))
    return out


REDUCED_SHARED_COST = 3  # an expression this costly, read by several reductions, is stored once for them


def _planes_read(n: Node, realize: set[int]) -> int:
    """How many buffers at least as large as `n` its inlined expression reads (the rest are broadcast vectors such
    as batch norm's per-channel statistics). An expression that reads one such buffer costs its readers the same
    traffic as a stored copy of it would, without the copy's write: batch norm's normalised input (x - mean) * rs,
    read by the affine output, the backward's channel sum and its input gradient, was stored once per layer."""
    return sum(1 for b in _boundary(n.srcs, realize) if b.size >= n.size)


def _shared_by_reductions(order: list[Node]) -> set[int]:
    """Elementwise nodes that two or more reductions would each recompute while reading their inputs, and that are
    the largest such expression (no elementwise reader of theirs is read by the same reductions). Stored once, the
    reductions read one buffer instead of every buffer the expression reads: batch norm's backward makes 3-4
    per-channel sums of the same upstream gradient (a ReLU mask, a pooling gradient), each had recomputed it."""
    readers: dict[int, list[Node]] = {}
    for n in order:
        for s in n.srcs:
            readers.setdefault(s.uid, []).append(n)
    reach: dict[int, frozenset[int]] = {}
    out: set[int] = set()
    for n in reversed(order):
        k = kind(n)
        if k not in ("elementwise", "movement"):
            continue
        sets = []
        for u in readers.get(n.uid, []):
            ku = kind(u)
            if ku == "reduce":
                sets.append(frozenset((u.uid,)))
            elif ku in ("elementwise", "movement"):
                sets.append(reach.get(u.uid, frozenset()))
        r = frozenset().union(*sets)
        reach[n.uid] = r
        inlined = [u for u in readers.get(n.uid, []) if kind(u) in ("elementwise", "movement")]
        if k == "elementwise" and len(r) > 1 and all(reach.get(u.uid) != r for u in inlined):
            out.add(n.uid)
    return out


def _fuse_epilogues(items: list[Item], users: dict[int, int], outputs: set[int]) -> list[Item]:
    """Fold an elementwise kernel into the GEMM that feeds it (bias, activation, residual add, BN at inference)
    when it reads the product element for element and nothing else reads the product."""
    gemms = {it.out.uid: it for it in items if it.kind == "gemm"}
    readers: dict[int, int] = {}
    for it in items:
        for x in it.inputs:
            readers[x.uid] = readers.get(x.uid, 0) + 1
    fused: set[int] = set()
    out: list[Item] = []
    for it in items:
        if it.kind == "elementwise" and it.out.dtype == dtypes.float32:
            for m in it.inputs:
                g = gemms.get(m.uid)
                if g is None or m.uid in fused or m.uid in outputs or m.size != it.out.size:
                    continue
                if readers.get(m.uid) == 1 and _reads_identically(it.out, m, users):
                    fused.add(m.uid)
                    # a GEMM that already has an epilogue (BN, then a clamp that reads it three times) grows it
                    mm, before = g.extra.get("epilogue", m), g.extra.get("extra", [])
                    extra = before + [x for x in it.inputs if x.uid != m.uid]
                    it = Item(
                        it.out,
                        g.inputs + extra[len(before) :],
                        "gemm",
                        gemm=g.gemm,
                        extra={"epilogue": mm, "extra": extra},
                    )
                    gemms[it.out.uid] = it
                    break
        out.append(it)
    return [it for it in out if not (it.kind == "gemm" and it.out.uid in fused)]


def _reads_identically(root: Node, target: Node, users: dict[int, int]) -> bool:
    """True when every read of `target` inside root's fused expression is at root's own linear index."""
    ok = True
    stack: list[tuple[Node, bool]] = [(root, True)]
    while stack:
        n, identity = stack.pop()
        if n is target:
            ok = ok and identity
            continue
        if n.realized or (n is not root and kind(n) in ("reduce", "matmul", "contract", "custom")):
            continue
        k = kind(n)
        if k == "movement":
            identity = identity and n.op == "reshape" and users.get(n.uid, 0) == 1
        for s in n.srcs:
            stack.append((s, identity))
    return ok


def _boundary(srcs: tuple[Node, ...], realize: set[int]) -> list[Node]:
    """The buffers an inlined expression reads, in first-visit order (deterministic argument order)."""
    out: list[Node] = []
    seen: set[int] = set()
    stack = list(reversed(srcs))
    while stack:
        n = stack.pop()
        if n.uid in seen:
            continue
        seen.add(n.uid)
        if n.realized or n.uid in realize:
            out.append(n)
        elif n.op != "const":
            stack.extend(reversed(n.srcs))
    return out
