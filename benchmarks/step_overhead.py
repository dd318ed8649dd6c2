"""Where a training step's time goes on the host: Python (graph building, autodiff, signatures, binding) against
kernels. For each bench model it times the eager step (forward + cross-entropy + backward + SGD built and realized
every call), the same step replayed by plait.compile_step, and the replay's kernel launches alone; the differences
are the Python per step. Small batches make the kernels short, so the Python shows.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/step_overhead.py --models cifar_cnn,gru --batch 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import plait
from plait.bench.models import get
from plait.bench.runners import freeze_dropout
from plait.frontends.native.jit import CompiledStep


def _timed_ms(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - t0) * 1e3


def _step_fn(model: Any, opt: plait.optim.Optimizer) -> Callable[[plait.Tensor, plait.Tensor], plait.Tensor]:
    loss_fn = plait.nn.CrossEntropyLoss()

    def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def measure(name: str, batch: int, device: str, iters: int) -> dict[str, float]:
    """Median ms of the eager step, the replayed step and the replay's launches alone, taken in turns (one of each
    per round) so that load from other jobs on a shared machine falls on all three alike."""
    bm = get(name)
    xs, ys = bm.inputs(batch)
    steps = []
    for _ in range(2):  # one model stepped eagerly, one compiled: an eager step would re-point the compiled one
        model = bm.plait_factory(device).train()
        freeze_dropout(model)
        steps.append(_step_fn(model, plait.optim.SGD(model.parameters(), lr=0.01)))
    eager, compiled = steps[0], plait.compile_step(steps[1], device=device)
    assert isinstance(compiled, CompiledStep)
    x, y = plait.tensor(xs, device=device), plait.tensor(ys, device=device)
    sync = plait.runtime.get_device(device).synchronize
    for _ in range(3):  # compile the kernels, then trace twice
        eager(x, y)
        compiled(x, y)
    replay = next(iter(compiled.traces.values())).replay
    assert replay is not None

    def launches() -> None:
        for launch in replay.launches:
            launch()

    times: dict[str, list[float]] = {"eager": [], "replayed": [], "kernels": []}
    for _ in range(iters):
        times["eager"].append(_timed_ms(lambda: eager(x, y), sync))
        times["replayed"].append(_timed_ms(lambda: compiled(x, y), sync))
        times["kernels"].append(_timed_ms(launches, sync))
    out = {k: statistics.median(v) for k, v in times.items()}
    out["launches"] = len(replay.launches)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="cifar_cnn,gru")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    print(
        "| model | batch | launches | eager step ms | replayed step ms | kernels alone ms | eager Python ms | replay Python ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        r = measure(name, args.batch, args.device, args.iters)
        print(
            f"| {name} | {args.batch} | {r['launches']:.0f} | {r['eager']:.1f} | {r['replayed']:.1f} | {r['kernels']:.1f}"
            f" | {r['eager'] - r['kernels']:.1f} | {r['replayed'] - r['kernels']:.1f} |"
        )


if __name__ == "__main__":
    main()
