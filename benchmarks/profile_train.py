"""Per-kernel report of one training step's forward + backward (the loss and every parameter's gradient as one
plan), for the benchmark models: which kernels a step has, of which kinds, and what each costs on a device.

    python benchmarks/profile_train.py --models cifar_cnn --batch 8 --device cpu --limit 25
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    import torch

    import plait
    from plait.bench.models import get
    from plait.graph import autodiff
    from plait.schedule.plan import Plan
    from plait.schedule.profile import format_report, profile_plan

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cifar_cnn")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--limit", type=int, default=25, help="kernels listed per model (slowest first)")
    ap.add_argument(
        "--per-image", action="store_true", help="convolutions in the per-image form (products summed over the batch)"
    )
    ap.add_argument(
        "--recompute", action="store_true", help="reductions recompute shared expressions (none stored for them)"
    )
    args = ap.parse_args()
    if args.per_image:
        import plait.nn.functional as F

        F.FOLD_MIN_ROWS = 1 << 30  # no convolution has that many rows per group: none takes the folded form
    if args.recompute:
        from plait.schedule import scheduler

        scheduler.REDUCED_SHARED_COST = 1 << 30  # no expression costs that much: none is stored for its reductions
    for name in args.models.split(","):
        spec = get(name)
        torch.manual_seed(0)
        ref = spec.torch_factory()
        model = spec.plait_factory(args.device)
        model.load_state_dict({k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()})
        model.train()
        x_np, y_np = spec.inputs(args.batch)
        x = plait.Tensor.from_numpy(x_np, device=args.device)
        y = plait.Tensor.from_numpy(y_np, device=args.device)
        loss = plait.nn.CrossEntropyLoss()(model(x), y)
        params = [p for p in model.parameters() if p.requires_grad]
        seed = plait.Tensor.from_numpy(np.ones((), np.float32), device=args.device).node
        grads = autodiff.gradients(loss.node, seed, [p.node for p in params])
        plan = Plan([loss.node, *grads.values()])
        plan.run()
        report = profile_plan(plan, args.reps)
        form = "per-image" if args.per_image else "folded"
        shared = "recomputed" if args.recompute else "stored"
        print(f"== {name} b{args.batch} on {args.device}, convolutions {form}, reductions' shared inputs {shared}")
        print(format_report(report.as_dict(), args.limit))


if __name__ == "__main__":
    main()
