"""Train a small CNN on scikit-learn's bundled digits (8x8 images, no download) with plait and with PyTorch side
by side: same initial weights, same batches in the same order, same optimizer. Prints per-epoch loss and test
accuracy for both, then a final line with both accuracies.

    python examples/train_digits.py [--device cpu] [--epochs 10]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import plait
import plait.nn.functional as F
from plait.models import digits_cnn
from plait.models.torch_reference import build


def evaluate_plait(model: plait.nn.Module, x: np.ndarray, y: np.ndarray, device: str) -> float:
    model.eval()
    with plait.no_grad():
        pred = model(plait.tensor(x, device=device)).argmax(axis=1).numpy()
    model.train()
    return float((pred == y).mean())


def evaluate_torch(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(1).numpy()
    model.train()
    return float((pred == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    args = ap.parse_args()

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8) in [0, 1]
    y = digits.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)

    torch.manual_seed(0)
    torch.set_num_threads(2)
    t_model = build("digits_cnn")
    p_model = digits_cnn()
    p_model.load_state_dict(t_model.state_dict())  # identical initial weights
    p_model.to(args.device)
    t_opt = torch.optim.SGD(t_model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    p_opt = plait.optim.SGD(p_model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    t_sched = torch.optim.lr_scheduler.CosineAnnealingLR(t_opt, T_max=args.epochs)
    p_sched = plait.optim.lr_scheduler.CosineAnnealingLR(p_opt, T_max=args.epochs)

    rng = np.random.default_rng(0)
    n_batches = len(x_tr) // args.batch  # drop the ragged last batch: one set of kernel shapes
    print(f"digits: {len(x_tr)} train / {len(x_te)} test images, plait on {args.device}")
    print("epoch  plait-loss  torch-loss  plait-acc  torch-acc  plait-s  torch-s")
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_tr))
        losses_p, losses_t, time_p, time_t = [], [], 0.0, 0.0
        for b in range(n_batches):
            idx = order[b * args.batch : (b + 1) * args.batch]
            xb, yb = x_tr[idx], y_tr[idx]

            t0 = time.perf_counter()
            loss_p = F.cross_entropy(
                p_model(plait.tensor(xb, device=args.device)), plait.tensor(yb, device=args.device)
            )
            p_opt.zero_grad()
            loss_p.backward()
            p_opt.step()
            losses_p.append(loss_p.item())
            t1 = time.perf_counter()
            loss_t = torch.nn.functional.cross_entropy(t_model(torch.from_numpy(xb)), torch.from_numpy(yb))
            t_opt.zero_grad()
            loss_t.backward()
            t_opt.step()
            losses_t.append(loss_t.item())
            time_p, time_t = time_p + t1 - t0, time_t + time.perf_counter() - t1
        p_sched.step()
        t_sched.step()
        acc_p = evaluate_plait(p_model, x_te, y_te, args.device)
        acc_t = evaluate_torch(t_model, x_te, y_te)
        print(
            f"{epoch:5d}  {np.mean(losses_p):10.5f}  {np.mean(losses_t):10.5f}  {acc_p:9.4f}  {acc_t:9.4f}"
            f"  {time_p:7.2f}  {time_t:7.2f}"
        )
    print(f"final test accuracy: plait {acc_p:.4f}  torch {acc_t:.4f}")


if __name__ == "__main__":
    main()
