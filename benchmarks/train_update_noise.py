"""How far apart float32 training updates are when only the arithmetic order differs, for `plait bench`'s check.

For each model: the first parameter's update after one SGD step (the quantity `plait bench` compares) from PyTorch in
float64 on the cpu (the reference), PyTorch float32 on the cpu, PyTorch float32 on `--torch-device` (e.g. cuda) and
plait on `--device`, all from the same weights and data. Prints, for every pair, the bench's two metrics: the
max-abs relative error (max |a - b| / max |b|) and the norm-relative error (||a - b|| / ||b||).

    python benchmarks/train_update_noise.py --models mobilenet_v2,gru --batch 64 --device cpu
"""

from __future__ import annotations

import argparse
import copy

import numpy as np


def torch_update(case: object, device: str, dtype: object) -> np.ndarray:
    """The first parameter's update of one torch SGD step on `device` in `dtype`."""
    import torch

    from plait.bench.runners import first_param, freeze_dropout

    model = copy.deepcopy(case.torch_model).to(device=device, dtype=dtype)  # type: ignore[attr-defined]
    model.train()
    freeze_dropout(model)
    x = torch.from_numpy(case.x).to(device)  # type: ignore[attr-defined]
    if x.is_floating_point():
        x = x.to(dtype)
    y = torch.from_numpy(case.y).to(device)  # type: ignore[attr-defined]
    opt = torch.optim.SGD(model.parameters(), lr=case.lr)  # type: ignore[attr-defined]
    _, probe = first_param(model)
    before = probe.detach().double().cpu().numpy().copy()
    opt.zero_grad()
    torch.nn.CrossEntropyLoss()(model(x), y).backward()
    opt.step()
    return probe.detach().double().cpu().numpy() - before


def metrics(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    d = np.abs(got - want)
    return float(d.max() / np.abs(want).max()), float(np.linalg.norm(d) / np.linalg.norm(want))


def main() -> None:
    import torch

    from plait.bench.matrix import Settings
    from plait.bench.models import get
    from plait.bench.runners import Case, PlaitRunner

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mobilenet_v2,gru")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cpu", help="plait device ('none' to skip plait)")
    ap.add_argument("--torch-device", default="cpu")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    s = Settings()
    for name in args.models.split(","):
        spec = get(name)
        torch.manual_seed(s.seed)
        ref_model = spec.torch_factory()
        x, y = spec.inputs(args.batch, s.seed)
        case = Case(spec, "train", args.batch, x, y, ref_model, s.lr)
        ups = {"torch-f64-cpu": torch_update(case, "cpu", torch.float64)}
        ups["torch-f32-cpu"] = torch_update(case, "cpu", torch.float32)
        if args.torch_device != "cpu":
            ups[f"torch-f32-{args.torch_device}"] = torch_update(case, args.torch_device, torch.float32)
        if args.device != "none":
            ups[f"plait-{args.device}"] = PlaitRunner(args.device).prepare(case).check()[1].astype(np.float64)
        names = list(ups)
        print(
            f"{name} b{args.batch}: first-parameter update {ups[names[0]].shape}, max|u| {np.abs(ups[names[0]]).max():.3e}"
        )
        for i, a in enumerate(names):
            for b in names[:i]:
                mx, nr = metrics(ups[a], ups[b])
                print(f"  {a:>22} vs {b:<22} max-abs rel {mx:.2e}   norm rel {nr:.2e}")


if __name__ == "__main__":
    main()
