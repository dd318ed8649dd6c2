"""The kernels a training step's loss and gradients schedule into, counted by kind and op, without building or
running any of them: a quick structural check of fusion changes (launch counts) on any machine, e.g. OpenCL's
schedule through PoCL for a model meant for a GPU.

    python benchmarks/train_step_items.py --models mobilenet_v2 --batch 2 --image 64 --device opencl:0
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np


def main() -> None:
    import plait
    from plait.bench.models import get
    from plait.graph import autodiff
    from plait.runtime import get_device
    from plait.schedule.profile import item_work
    from plait.schedule.scheduler import schedule

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--image", type=int, default=64, help="square image side")
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--list", action="store_true", help="also print every item in order")
    args = ap.parse_args()
    r = get_device(args.device).renderer
    for name in args.models.split(","):
        spec = get(name)
        model = spec.plait_factory(args.device).train()
        rng = np.random.default_rng(0)
        x = plait.tensor(
            rng.standard_normal((args.batch, 3, args.image, args.image), dtype=np.float32), device=args.device
        )
        y = plait.tensor(rng.integers(0, spec.num_classes, size=(args.batch,)), device=args.device)
        loss = plait.nn.CrossEntropyLoss()(model(x), y)
        params = list(model.parameters())
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=args.device).node
        grads = autodiff.gradients(loss.node, seed, [p.node for p in params])
        outs = [loss.node, *(grads[p.node.uid] for p in params if p.node.uid in grads)]
        items = schedule(
            outs,
            r.__dict__.get("split_parts", 256 if r.dialect == "opencl" else 16),
            implicit_conv=getattr(r, "implicit_conv", False),
            conv_span=getattr(r, "conv_span", False),
            split_k=getattr(r, "split_k", False),
            winograd=r.dialect == "c",
            winograd_cl=r.dialect == "opencl",
        )
        kinds = Counter(it.kind for it in items if it.kind != "alias")
        moved = sum(item_work(it)[1] for it in items if it.kind != "alias")
        ops = Counter(f"{it.kind}:{it.out.op}" for it in items if it.kind not in ("alias", "gemm"))
        print(
            f"== {name} b{args.batch} {args.image}x{args.image} on {args.device}: {sum(kinds.values())} kernels, {moved / 1e9:.3f} GB compulsory traffic"
        )
        print("by kind: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))
        print("by op: " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
        if args.list:
            for it in items:
                print(it.kind, it.out.op, it.out.shape, [(x.op, x.shape) for x in it.inputs])


if __name__ == "__main__":
    main()
