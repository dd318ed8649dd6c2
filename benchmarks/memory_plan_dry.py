"""Memory plan of a model's training-step gradient graph at any batch, without running it: the graph is built on
the cpu, then scheduled with one device kind's options (OpenCL: implicit gathers, split K, Winograd) and planned,
so the peak of e.g. vgg16's batch-64 step on a GPU can be read on a small machine.

    .venv/bin/python benchmarks/memory_plan_dry.py --models vgg16,resnet18 --batch 64 --kind opencl
"""

from __future__ import annotations

import argparse
from typing import Any


def plan_of(model_name: str, batch: int, kind: str) -> dict[str, float]:
    """Bytes (MB) of the gradient plan's buffers with and without sharing, and what stays kept."""
    import plait
    import plait.frontends.native.tensor as tensor_mod
    from plait.bench.models import get
    from plait.schedule import plan as plan_mod
    from plait.schedule.scheduler import schedule

    bench = get(model_name)
    model = bench.plait_factory("cpu").train()
    xs, ys = bench.inputs(batch)
    x, y = plait.Tensor.from_numpy(xs), plait.Tensor.from_numpy(ys)
    caught: list[list[Any]] = []
    saved = tensor_mod.realize
    tensor_mod.realize = lambda nodes: caught.append(list(nodes))
    try:
        loss = plait.nn.CrossEntropyLoss()(model(x), y)
        loss.backward()
    finally:
        tensor_mod.realize = saved
    outputs = [n for n in caught[0] if not n.realized]
    opencl = kind == "opencl"
    items = schedule(
        outputs,
        256 if opencl else 16,
        implicit_conv=True,
        conv_span=opencl,
        split_k=opencl,
        winograd=not opencl,
        winograd_cl=opencl,
    )
    at = {it.out.uid: i for i, it in enumerate(items)}
    sizes = [it.out.size * it.out.dtype.itemsize for it in items]
    alias = [at.get(it.inputs[0].uid, -1) if it.kind == "alias" else None for it in items]
    reads = [[at[n.uid] for n in it.inputs if n.uid in at] for it in items]
    seen = {n.uid for n in outputs} | plan_mod.held(set(at))
    pinned = {i for i, it in enumerate(items) if it.out.uid in seen}
    mem = plan_mod.plan_memory(sizes, alias, reads, pinned)
    own = sum(s for i, s in enumerate(sizes) if alias[i] is None and mem.slot[i] is None)
    unshared = sum(s for i, s in enumerate(sizes) if alias[i] is None)
    biggest = sorted(((s, items[i].out.op, items[i].out.shape) for i, s in enumerate(sizes)), reverse=True)[:5]
    return {
        "items": len(items),
        "unshared MB": unshared / 2**20,
        "planned MB": (own + sum(mem.sizes)) / 2**20,
        "kept MB": own / 2**20,
        "slots MB": sum(mem.sizes) / 2**20,
        "largest": [f"{op} {shape} {s / 2**20:.0f} MB" for s, op, shape in biggest],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="vgg16,resnet18")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--kind", choices=("opencl", "cpu"), default="opencl")
    args = ap.parse_args()
    for name in args.models.split(","):
        print(name, args.batch, args.kind, plan_of(name, args.batch, args.kind), flush=True)


if __name__ == "__main__":
    main()
