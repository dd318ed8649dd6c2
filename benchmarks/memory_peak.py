"""Peak device memory of a compiled training step (forward, cross-entropy, backward, SGD through
plait.compile_step, as `plait bench --modes train` runs it), with plans sharing intermediate storage and without.

The allocator counts the bytes held by live buffers; each phase's peak is reported above what the model's weights
and the batch already held: the eager first call, the two traced calls, and one replay. Each setting runs in a
fresh process so that neither sees the other's cached blocks or compiled recipes.

    .venv/bin/python benchmarks/memory_peak.py --models resnet18,vgg16 --batch 2 --device cpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def measure(model_name: str, batch: int, device: str) -> dict[str, float]:
    """Peaks (MB) of one model's training step phases in this process, under its PLAIT_REUSE_BUFFERS."""
    import plait
    from plait.bench.models import get
    from plait.runtime import get_device

    bench = get(model_name)
    model = bench.plait_factory(device).train()
    opt = plait.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = plait.nn.CrossEntropyLoss()

    @plait.compile_step(device=device)
    def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    xs, ys = bench.inputs(batch)
    x, y = plait.Tensor.from_numpy(xs, device=device), plait.Tensor.from_numpy(ys, device=device)
    alloc = get_device(device).allocator
    base = alloc.in_use
    out: dict[str, float] = {}
    for phase in ("eager", "traced 1", "traced 2", "replay"):
        out["replayed"] = float(any(t.replay is not None for t in step.traces.values()))  # this call will replay
        alloc.reset_peak()
        t0 = time.perf_counter()
        loss = step(x, y)
        out[f"{phase} s"] = time.perf_counter() - t0
        out[f"{phase} peak MB"] = (alloc.peak - base) / 2**20
        out[f"{phase} loss"] = float(loss.numpy())
    out["held after MB"] = (alloc.in_use - base) / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18,vgg16")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reuse", default="0,1", help="PLAIT_REUSE_BUFFERS values to run, comma-separated")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # child process: measure this model and print JSON
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.batch, args.device)))
        return
    cols = ["model", "batch", "reuse", "eager peak MB", "traced peak MB", "4th call peak MB", "held after MB"]
    print("| " + " | ".join([*cols, "4th loss", "replay"]) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for name in args.models.split(","):
        for reuse in args.reuse.split(","):
            env = {**os.environ, "PLAIT_REUSE_BUFFERS": reuse}
            cmd = [sys.executable, __file__, "--one", name, "--batch", str(args.batch), "--device", args.device]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                print(f"| {name} | {args.batch} | {reuse} | failed: {proc.stderr.strip().splitlines()[-1]} |")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            traced = max(r["traced 1 peak MB"], r["traced 2 peak MB"])
            print(
                f"| {name} | {args.batch} | {reuse} | {r['eager peak MB']:.0f} | {traced:.0f} | "
                f"{r['replay peak MB']:.0f} | {r['held after MB']:.0f} | {r['replay loss']:.4f} | "
                f"{bool(r['replayed'])} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
