"""A/B timing of one training step (forward, cross-entropy, backward, SGD) on a shared machine: plait's compiled
step built with the current backward formulation ("new") and with named parts of it switched back to the op-by-op
gradient ("old"), plus PyTorch eager, all in one process and timed in turns (round robin), so that the load of the
moment weighs on every variant alike. Medians over the rounds of the wall time and of the process CPU time (and its minimum)
(with --threads 1 the CPU time hardly depends on the other jobs' load).

    OMP_WAIT_POLICY=PASSIVE python benchmarks/train_step_ab.py --models cifar_cnn --batch 16 --rounds 7

Parts (--old, comma-separated): conv (convolution gradients in the forms `nn.functional._conv_vjp` picks: the input
gradient as a transposed convolution, the weight gradient with the columns read in place), bn (batch norm's fused
backward in closed form, `nn.functional._batch_norm_vjp`), fwd (cpu training convolutions' forward per image,
`nn.functional._forward_per_image`: back to the folded product), pool (max pooling's direct gradient kernel,
`nn.functional._max_pool_train`: back to im2col columns, or a reduction over tiles), dw (the cpu depthwise weight
gradient kernel, plait/graph/ops/depthwise_grad_c.py: back to patch columns and GEMVs), plain (large weights'
gradients as dy @ columns^T, `nn.functional.WGRAD_PLAIN_MIN`: back to the swapped product and a transposing copy),
wgrad (the cpu weight gradient kernel of plait/graph/ops/conv_wgrad_c.py: back to folded patch columns and a GEMM),
bnsum (batch norm's channel sums over planes then images, `nn.functional._channel_sums`: back to one split sum),
s1 (the weight gradient kernel's stride-1 form, plait/codegen/wgrad_c.py `shifted`: back to the patch-row gather and
the folded GEMM below 28x28 planes), bnstat (batch norm's cpu statistics kernels, plait/graph/ops/bnstat_c.py:
back to two channel-sum reductions each way).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


@contextlib.contextmanager
def old_parts(names: list[str]) -> Iterator[None]:
    """Switch the named backward parts off while a step's graph is built and traced (replays keep what was traced)."""
    import plait.nn.functional as F

    saved: dict[str, Any] = {}
    if "conv" in names:
        saved["_conv_vjp"] = F._conv_vjp
        F._conv_vjp = lambda *a, **k: None
    if "bn" in names:
        saved["_batch_norm_vjp"] = F._batch_norm_vjp
        F._batch_norm_vjp = lambda *a, **k: None
    if "fwd" in names:
        saved["PER_IMAGE_MIN_POSITIONS"] = F.PER_IMAGE_MIN_POSITIONS
        F.PER_IMAGE_MIN_POSITIONS = 1 << 30  # no convolution has that many positions: every forward stays folded
    if "pool" in names:
        saved["pool_grad.supports"] = F.pool_grad.supports
        F.pool_grad.supports = lambda node: False
    if "dw" in names:
        saved["depthwise_grad_c.supports"] = F.depthwise_grad_c.supports
        F.depthwise_grad_c.supports = lambda node, win: False
    if "wgrad" in names:
        saved["conv_wgrad_c.supports"] = F.conv_wgrad_c.supports
        F.conv_wgrad_c.supports = lambda node, win: False
    if "bnsum" in names:
        saved["_channel_sums"] = F._channel_sums
        F._channel_sums = lambda x, axes: x.sum(axis=axes, keepdims=True)
    if "s1" in names:
        saved["conv_wgrad_c.wgrad_c.shifted"] = F.conv_wgrad_c.wgrad_c.shifted
        F.conv_wgrad_c.wgrad_c.shifted = lambda win: False
    if "bnstat" in names:
        saved["bnstat_c.supports"] = F.bnstat_c.supports
        F.bnstat_c.supports = lambda node: False
    if "plain" in names:
        saved["WGRAD_PLAIN_MIN"] = F.WGRAD_PLAIN_MIN
        F.WGRAD_PLAIN_MIN = 1 << 62  # every folded weight gradient swapped, then transposed
    try:
        yield
    finally:
        for k, v in saved.items():
            module, _, name = k.rpartition(".")
            setattr(functools.reduce(getattr, module.split("."), F) if module else F, name, v)


def plait_step(name: str, batch: int, device: str, old: list[str]) -> tuple[Callable[[], Any], float]:
    """A replaying compiled step of a fresh model (weights from the torch twin) and its first loss."""
    import torch

    import plait
    from plait.bench.models import get

    spec = get(name)
    torch.manual_seed(0)
    ref = spec.torch_factory()
    model = spec.plait_factory(device)
    model.load_state_dict({k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()})
    model.train()
    for m in model.modules():
        if type(m).__name__ == "Dropout":
            m.p = 0.0
    x_np, y_np = spec.inputs(batch)
    x = plait.Tensor.from_numpy(x_np, device=device)
    y = plait.Tensor.from_numpy(y_np, device=device)
    opt = plait.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = plait.nn.CrossEntropyLoss()

    @plait.compile_step(device=device)
    def step(xx: Any, yy: Any) -> Any:
        opt.zero_grad()
        loss = loss_fn(model(xx), yy)
        loss.backward()
        opt.step()
        return loss

    with old_parts(old):
        first = float(step(x, y).item())
        for _ in range(2):
            step(x, y)
    return (lambda: step(x, y).item()), first


def torch_step(name: str, batch: int) -> tuple[Callable[[], Any], float]:
    import torch

    from plait.bench.models import get

    spec = get(name)
    torch.manual_seed(0)
    model = spec.torch_factory().train()
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    x_np, y_np = spec.inputs(batch)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np).long()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.detach())

    first = step()
    step()
    return step, first


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="cifar_cnn")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--old", default="conv,bn", help="parts switched off in the 'old' variant")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    old = [p for p in args.old.split(",") if p]
    for name in args.models.split(","):
        steps: dict[str, Callable[[], Any]] = {}
        firsts: dict[str, float] = {}
        steps["new"], firsts["new"] = plait_step(name, args.batch, args.device, [])
        steps["old"], firsts["old"] = plait_step(name, args.batch, args.device, old)
        steps["torch"], firsts["torch"] = torch_step(name, args.batch)
        times: dict[str, list[float]] = {k: [] for k in steps}
        cpu: dict[str, list[float]] = {k: [] for k in steps}
        load = [os.getloadavg()[0]]
        for _ in range(args.rounds):
            for k, f in steps.items():
                t, c = time.perf_counter(), time.process_time()
                f()
                times[k].append((time.perf_counter() - t) * 1e3)
                cpu[k].append((time.process_time() - c) * 1e3)
        load.append(os.getloadavg()[0])
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"== {name} b{args.batch} on {args.device}, old = {old}, {args.rounds} rounds, load {load[0]:.1f}-{load[1]:.1f}"
        )
        print("first loss: " + ", ".join(f"{k} {v:.5f}" for k, v in firsts.items()))
        for k in steps:
            spread = (np.percentile(times[k], 75) - np.percentile(times[k], 25)) / 2
            ratio = med["torch"] / med[k]
            print(
                f"{k:6s} {med[k]:10.2f} ms  ±{spread:.2f}  torch/{k} {ratio:.2f}x"
                f"  cpu time median {statistics.median(cpu[k]):.2f} ms, min {min(cpu[k]):.2f} ms"
            )


if __name__ == "__main__":
    main()
