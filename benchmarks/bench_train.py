"""One training step (forward, backward, SGD update) of resnet18 (batch 16, 3x224x224 by default) and of the GRU
sentiment classifier, plait on a device against PyTorch CPU in the same run, same weights, same data.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/bench_train.py [--device cpu] [--image 224] [--iters 5]

PyTorch runs with torch.set_num_threads(2) (set OMP_WAIT_POLICY=PASSIVE in the environment so its idle OpenMP
threads do not spin against plait's). Reports the median and spread of step times and the first-step losses,
which must agree before a time is reported.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait.models.torch_reference import build


def _time(step: Callable[[], float], warmup: int, iters: int) -> tuple[list[float], float]:
    first = step()
    for _ in range(warmup - 1):
        step()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times, first


def bench(name: str, kw: dict[str, object], x: np.ndarray, y: np.ndarray, device: str, warmup: int, iters: int) -> None:
    torch.manual_seed(0)
    tm = build(name, **kw)
    pm = getattr(plait.models, name)(**kw)
    pm.load_state_dict(tm.state_dict())
    pm.to(device)
    t_opt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)
    p_opt = plait.optim.SGD(pm.parameters(), lr=0.01, momentum=0.9)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def t_step() -> float:
        loss = torch.nn.functional.cross_entropy(tm(xt), yt)
        t_opt.zero_grad()
        loss.backward()
        t_opt.step()
        return float(loss.item())

    def p_step() -> float:
        loss = F.cross_entropy(pm(plait.tensor(x, device=device)), plait.tensor(y, device=device))
        p_opt.zero_grad()
        loss.backward()
        p_opt.step()
        return float(loss.item())

    t0 = time.perf_counter()
    p_times, p_loss = _time(p_step, warmup, iters)
    compile_s = time.perf_counter() - t0 - sum(p_times)
    t_times, t_loss = _time(t_step, warmup, iters)
    if abs(p_loss - t_loss) > 1e-3 * max(1.0, abs(t_loss)):
        raise SystemExit(f"{name}: first-step losses disagree (plait {p_loss}, torch {t_loss}); not reporting times")
    pm_, tm_ = statistics.median(p_times), statistics.median(t_times)
    print(
        f"| {name} | {tuple(x.shape)} | {pm_ * 1e3:.0f} ms ({min(p_times) * 1e3:.0f}-{max(p_times) * 1e3:.0f}) "
        f"| {tm_ * 1e3:.0f} ms ({min(t_times) * 1e3:.0f}-{max(t_times) * 1e3:.0f}) | {pm_ / tm_:.2f}x "
        f"| {p_loss:.5f} / {t_loss:.5f} | {compile_s:.1f} s |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description="plait vs PyTorch: one training step")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--only", choices=["resnet18", "gru_classifier"], default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    print(f"date {datetime.date.today()}  device {args.device}  cpu {platform.processor() or platform.machine()}")
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}  plait {plait.__version__}  float32, NCHW")
    print(f"warmup {args.warmup}, iters {args.iters}; times are medians (min-max)\n")
    print(
        "| model | input | plait step | torch step | plait/torch | first loss plait / torch | plait warm-up+compile |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    if args.only in (None, "resnet18"):
        x = rng.standard_normal((args.batch, 3, args.image, args.image)).astype(np.float32)
        y = rng.integers(0, 1000, args.batch).astype(np.int64)
        bench("resnet18", {}, x, y, args.device, args.warmup, args.iters)
    if args.only in (None, "gru_classifier"):
        tokens = rng.integers(1, 5000, (args.batch, args.seq)).astype(np.int64)
        y = rng.integers(0, 2, args.batch).astype(np.int64)
        bench("gru_classifier", {}, tokens, y, args.device, args.warmup, args.iters)


if __name__ == "__main__":
    main()
