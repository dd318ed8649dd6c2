"""One training step's parameter gradients from plait against PyTorch's, model by model, at small images: a quick
correctness check of training-kernel changes on any device (PoCL included) where `plait bench --modes train` at full
size would take too long. Dropout is off in both, as in the bench; prints each model's losses and its worst
norm-relative parameter-gradient error.

    python benchmarks/train_grad_check.py --models cifar_cnn:32,alexnet:64,resnet50:64 --device opencl:0 --batch 2
"""

from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    import torch

    import plait
    from plait.bench.models import get
    from plait.bench.runners import freeze_dropout

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cifar_cnn:32,alexnet:64,mobilenet_v2:64,resnet50:64", help="name:image side")
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    for item in args.models.split(","):
        name, side = item.split(":")
        spec = get(name)
        torch.manual_seed(0)
        ref = spec.torch_factory().train()
        model = spec.plait_factory(args.device)
        model.load_state_dict(ref.state_dict())
        model.train()
        freeze_dropout(ref)
        freeze_dropout(model)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((args.batch, spec.sample_shape[0], int(side), int(side))).astype(np.float32)
        y = rng.integers(0, spec.num_classes, size=(args.batch,))
        loss = plait.nn.functional.cross_entropy(
            model(plait.tensor(x, device=args.device)), plait.tensor(y, device=args.device)
        )
        ref_loss = torch.nn.functional.cross_entropy(ref(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        ref_loss.backward()
        worst, where = 0.0, ""
        for (key, p), (_, q) in zip(model.named_parameters(), ref.named_parameters(), strict=True):
            got, want = p.grad.numpy(), q.grad.numpy()
            err = float(np.linalg.norm(got - want) / max(float(np.linalg.norm(want)), 1e-12))
            if err > worst:
                worst, where = err, key
        print(
            f"{name} {side}x{side} b{args.batch} on {args.device}: loss {loss.item():.6f} (torch {ref_loss.item():.6f}),"
            f" worst gradient error {worst:.2e} ({where})",
            flush=True,
        )


if __name__ == "__main__":
    main()
