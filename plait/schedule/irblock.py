"""Inverted-residual blocks fused into one cpu kernel at inference (plait/codegen/irblock_c.py): a 1x1 expand product,
the 3x3 depthwise convolution that alone reads it and the 1x1 projection that alone reads that, each with its fused
epilogue, become one item whose expanded tensor never goes to memory (so do an image stem in the expand's place,
and a depthwise window and projection alone). Only plans that run constant work once (a
compiled inference plan: the weights are buffers, packed when the plan is built) take it; a training step keeps the
three kernels, since its backward reads the expanded tensor."""

from __future__ import annotations

from dataclasses import replace

from plait.codegen import gemm_c, irblock_c
from plait.codegen.pointwise_c import VW, LanesPlan
from plait.graph.node import Node
from plait.graph.ops.pointwise_weight import pointwise_weight
from plait.schedule.scheduler import Item

# Input planes of at most this many pixels take the fused block (all of mobilenet_v2's blocks with an expand product,
# from the 112x112 one on; planes over irblock_c.ROWS_PIXELS are split among threads by rows): measured in
# docs/benchmarks.md.
MAX_PIXELS = 12544


def _weight_1x1(it: Item, images: int) -> tuple[Node, tuple[int, int, int]] | None:
    """The weight buffer of a 1x1 product item over `images` contiguous images (a lanes product's packed weight's
    source, or a GEMM's A, the same for every image) and its view (offset, row stride, column stride); None when it
    is not such a product of a buffer weight."""
    spec = it.gemm
    if it.kind not in ("gemm", "pointwise") or spec is None or spec.batch != images or spec.conv is not None:
        return None
    if spec.conv_t is not None or spec.a_nchw is not None or spec.b[2:] != (spec.n, 1):
        return None
    if any(spec.b_at(z) != z * spec.k * spec.n or spec.a_at(z) != spec.a[0] for z in range(images)):
        return None
    if it.kind == "pointwise":
        packed = it.inputs[0]
        return packed.srcs[0], packed.arg.w_view
    weight = it.inputs[0]
    return (weight, (spec.a[0], spec.a[2], spec.a[3])) if weight.buffer is not None else None


def _stem(e: Item, plan: irblock_c.IRBlockPlan) -> tuple[int, int, int, int] | None:
    """(image channels, height, width, stride) when item `e` is an image stem the block can take as its expand
    product: a 3x3 convolution with padding 1 and stride 1 or 2 over few channels (gemm_c.DIRECT_MAX_CIN) of
    `plan`'s contiguous images onto its plane, its weight a buffer read in place; else None."""
    spec = e.gemm
    if e.kind != "gemm" or spec is None or spec.conv is None or spec.conv_t is not None or spec.a_nchw is not None:
        return None
    win = spec.conv
    if (win.kh, win.kw, win.ph, win.pw, win.dh, win.dw, win.fold) != (3, 3, 1, 1, 1, 1, False):
        return None
    if win.sh != win.sw or win.sh not in (1, 2) or win.c > gemm_c.DIRECT_MAX_CIN or spec.k != 9 * win.c:
        return None
    if win.n != plan.images or (win.oh, win.ow) != (plan.h, plan.w) or e.inputs[0].buffer is None or spec.a[3] != 1:
        return None
    image = win.c * win.h * win.w
    if any(spec.a_at(z) != spec.a[0] or spec.b_at(z) != z * image for z in range(plan.images)):
        return None
    return win.c, win.h, win.w, win.sh


def _plan(e: Item | None, d: Item, p: Item) -> irblock_c.IRBlockPlan | None:
    """The block of expand item `e` (None: a block without one), depthwise item `d` and projection item `p` when their
    shapes chain and the depthwise window is 3x3 with padding 1 and stride 1 or 2 over contiguous images; else
    None."""
    es, ds, ps = None if e is None else e.gemm, d.gemm, p.gemm
    if ds is None or ps is None or ds.conv is None or d.kind != "gemm" or d.inputs[0].buffer is None:
        return None
    if e is not None and es is None:
        return None
    win = ds.conv
    window = (win.kh, win.kw, win.ph, win.pw, win.dh, win.dw) == (3, 3, 1, 1, 1, 1)
    if not window or win.sh != win.sw or win.sh not in (1, 2) or ds.m != 1 or ds.k != 9:
        return None
    if ds.a[1] != 0 or ds.a[2:] != (9, 1) or ds.a_inner != 9 or ds.b[2:] != (0, 0) or ds.b_inner != win.h * win.w:
        return None
    if ds.b[0] != 0 or (win.n > 1 and ds.b[1] != win.c * win.h * win.w):
        return None
    cin, c1, pixels = (win.c, win.c, win.h * win.w) if es is None else (es.k, es.m, es.n)
    plan = irblock_c.IRBlockPlan(cin, c1, ps.m, win.h, win.w, win.sh, win.n, es is not None)
    chained = c1 == win.c == ds.inner == ps.k and ds.batch == win.n * win.c
    chained = chained and pixels == win.h * win.w and ps.n == plan.ho * plan.wo
    return plan if chained and plan.c1 % irblock_c.GP == 0 and pixels <= MAX_PIXELS else None


def _with_expand(e: Item, d: Item, p: Item) -> tuple[irblock_c.IRBlockPlan, tuple[Node, tuple[int, int, int]]] | None:
    """The block with item `e` as its expand product (a 1x1 product, or an image stem: irblock_c.WITH_STEM) and e's
    weight with its view (offset, row stride, column stride); None when `e` can be neither."""
    plan = _plan(e, d, p)
    if plan is None:
        return None
    w1 = _weight_1x1(e, plan.images)
    if w1 is not None:
        return plan, w1
    stem = _stem(e, plan) if irblock_c.WITH_STEM else None
    if stem is None or e.gemm is None:
        return None
    return replace(plan, stem=stem), (e.inputs[0], (e.gemm.a[0], e.gemm.a[2], e.gemm.a[3]))


def fuse(items: list[Item], outputs: set[int]) -> list[Item]:
    """Replace each expand -> depthwise -> projection run of items (each product read only by the next, none an
    output) by one `irblock` item reading the block's input, the three weights packed at plan build (constant items)
    and the three epilogues' buffers. An image stem that alone makes the depthwise input stands in for the expand
    product (irblock_c.WITH_STEM: the block reads the image); a depthwise -> projection pair whose input neither
    makes becomes a block without an expand product, reading the depthwise input (irblock_c.WITHOUT_EXPAND)."""
    readers: dict[int, int] = {}
    for it in items:
        for x in it.inputs:
            readers[x.uid] = readers.get(x.uid, 0) + 1
    producer = {it.out.uid: i for i, it in enumerate(items)}
    drop: set[int] = set()
    fused: dict[int, list[Item]] = {}
    for i, d in enumerate(items):
        if d.kind != "gemm" or d.gemm is None or d.gemm.conv is None or len(d.inputs) < 2:
            continue
        users = [k for k, it in enumerate(items) if len(it.inputs) > 1 and it.inputs[1].uid == d.out.uid]
        if len(users) != 1 or readers.get(d.out.uid) != 1 or d.out.uid in outputs:
            continue
        p = items[users[0]]
        # with the expand product that alone makes the depthwise input, else (a block without one) on its own
        j = producer.get(d.inputs[1].uid)
        e = (
            items[j]
            if j is not None and readers.get(items[j].out.uid) == 1 and items[j].out.uid not in outputs
            else None
        )
        found = None if e is None else _with_expand(e, d, p)
        plan: irblock_c.IRBlockPlan | None = None
        w1: tuple[Node, tuple[int, int, int]] | None = None
        if found is not None:
            plan, w1 = found
        else:
            e = None
            plan = _plan(None, d, p) if irblock_c.WITHOUT_EXPAND else None
        if plan is None:
            continue
        w2 = _weight_1x1(p, plan.images)
        if w2 is None:
            continue
        ud = pointwise_weight(d.inputs[0], LanesPlan(plan.c1, 9, 1, plan.c1 // VW, (d.gemm.a[0], 9, 1)))
        u2 = pointwise_weight(w2[0], LanesPlan(plan.m2, plan.c1, 1, irblock_c.NV, w2[1]))
        weights = [(ud, d.inputs[0]), (u2, w2[0])]
        if w1 is not None:
            weights.insert(0, (pointwise_weight(w1[0], LanesPlan(plan.c1, plan.cin, 1, irblock_c.NV, w1[1])), w1[0]))
        packs = [Item(u, [src], "custom", extra={"constant": True}) for u, src in weights]
        stages = [d, p] if e is None else [e, d, p]
        extras = [x for it in stages for x in it.extra.get("extra", [])]
        block = Item(
            p.out,
            [d.inputs[1] if e is None else e.inputs[1], *(u for u, _ in weights), *extras],
            "irblock",
            extra={"irblock": plan, "epilogues": (None if e is None else e.epilogue(), d.epilogue(), p.epilogue())},
        )
        drop.add(i)
        if e is not None and j is not None:
            drop.add(j)
        drop.update(producer[it.inputs[0].uid] for it in stages if it is not d and it.kind == "pointwise")
        fused[users[0]] = [*packs, block]
    out: list[Item] = []
    for i, it in enumerate(items):
        if i not in drop:
            out.extend(fused.get(i, [it]))
    return out
