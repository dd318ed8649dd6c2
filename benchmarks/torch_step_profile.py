"""PyTorch's side of a training step, kernel by kernel: one model's step (forward, cross-entropy, backward, SGD)
under torch.profiler on CUDA (float32, TF32 off, `cudnn.benchmark` as `plait bench` sets them), CUDA kernels summed
by name, slowest first: cuDNN's equivalents of plait's per-kernel report (benchmarks/profile_step.py).

    tools/gpu-run.sh python3 benchmarks/torch_step_profile.py --models vgg16 --batch 64
"""

from __future__ import annotations

import argparse
from collections import defaultdict


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from plait.bench.models import get

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="vgg16")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--limit", type=int, default=40)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    for name in args.models.split(","):
        spec = get(name)
        torch.manual_seed(0)
        model = spec.torch_factory().cuda().train()
        x_np, y_np = spec.inputs(args.batch)
        x, y = torch.from_numpy(x_np).cuda(), torch.from_numpy(y_np).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        for i in range(3 + args.steps):
            if i == 3:
                torch.cuda.synchronize()
                prof = profile(activities=[ProfilerActivity.CUDA])
                prof.__enter__()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        torch.cuda.synchronize()
        prof.__exit__(None, None, None)
        per: dict[str, list[float]] = defaultdict(list)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name].append(ev.device_time_total / 1e3 / args.steps)
        total = sum(sum(v) for v in per.values())
        print(f"== torch {name} b{args.batch}: {total:.3f} ms of CUDA kernels per step")
        for kname, ts in sorted(per.items(), key=lambda kv: -sum(kv[1]))[: args.limit]:
            print(f"{sum(ts):8.3f} ms {len(ts) / args.steps:5.1f}x  {kname[:150]}")


if __name__ == "__main__":
    main()
