"""First-compile and warm-cache compile time of the bench models: where the time of `plait.jit`'s first call goes.

Each (model, cache state) runs in a fresh Python process, so nothing is remembered in memory between them; the cold
run gets an empty PLAIT_CACHE_DIR, the warm run then reuses that folder. The first call is split into building the
plait model (weights), tracing + scheduling + rendering (Python), building the kernels (the device compiler: gcc on
cpu, the OpenCL driver on GPUs) and the first execution; "compiler CPU s" is the CPU time of the compiler processes
(gcc, and on NVIDIA OpenCL the build worker processes of plait/runtime/opencl_build.py), which does not depend on how
busy the machine is.

`--mode train` times a `plait.compile_step` training step (forward, cross-entropy, backward, SGD) the way the bench's
training cell sets it up: the eager first call and the two traced calls, then one replay. On OpenCL the build time is
split further: "workers s" in opencl_build's worker processes (count of kernels), "in-process s" in this process's
driver builds and binary loads (count), and "plans" how many plan builds asked for kernels. Each child gets its own
empty CUDA_CACHE_PATH, so NVIDIA's JIT cache is as cold as the kernel cache (`--driver-cache` keeps the user's).

    python benchmarks/bench_compile.py --device cpu --models alexnet,resnet18,resnet50,vgg16,mobilenet_v2
    tools/gpu-run.sh python3 benchmarks/bench_compile.py --device opencl:0 --mode train --batch 64 --cold-only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

MODELS = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2")


class _Timed:
    """Seconds and calls of one function, wrapped in place on its module or class for this process only."""

    def __init__(self, owner: object, name: str, count: Callable[..., int] = lambda *a: 1):
        self.seconds, self.calls, self.items = 0.0, 0, 0
        self.log: list[tuple[int, float]] = []  # (items, seconds) of each call
        inner = getattr(owner, name)

        def timed(*args: object) -> object:
            self.calls += 1
            items = count(*args)
            self.items += items
            start = time.perf_counter()
            try:
                return inner(*args)
            finally:
                took = time.perf_counter() - start
                self.seconds += took
                self.log.append((items, round(took, 3)))

        setattr(owner, name, timed)


def measure(model: str, device: str, batch: int, mode: str) -> dict[str, Any]:
    """One model's first call in this (fresh) process, in seconds per stage (for training: up to the first replay)."""
    t0 = time.perf_counter()
    import plait
    from plait.bench.models import get
    from plait.schedule import plan as plan_mod

    spec = get(model)
    t1 = time.perf_counter()
    net = spec.plait_factory(device)
    net = net.eval() if mode == "infer" else net.train()
    x, y = spec.inputs(batch)
    t2 = time.perf_counter()
    plans = _Timed(plan_mod, "_compile", lambda _dev, kernels, _items: len(kernels))
    workers = in_process = None
    if device.startswith("opencl"):
        from plait.runtime import opencl, opencl_build

        workers = _Timed(opencl_build, "build_binaries", lambda _dev, sources, *a: len(sources))
        in_process = _Timed(opencl.OpenCLDevice, "_build")
    dev = plait.runtime.get_device(device)
    calls: list[float] = []
    if mode == "infer":
        f = plait.jit(lambda t: net(t), device=device)
        f.plan_for([x])
        t3 = time.perf_counter()
        f(x)
    else:
        opt = plait.optim.SGD(net.parameters(), lr=0.01)
        loss_fn = plait.nn.CrossEntropyLoss()

        @plait.compile_step(device=device)
        def step(a: object, b: object) -> object:
            opt.zero_grad()
            loss = loss_fn(net(a), b)
            loss.backward()
            opt.step()
            return loss

        xt, yt = (plait.Tensor.from_numpy(a, device=device) for a in (x, y))
        for _ in range(3):  # the eager call and the two traced ones: the bench's training setup
            step(xt, yt)
            dev.synchronize()
            calls.append(time.perf_counter() - (t2 + sum(calls)))
        t3 = time.perf_counter()
        step(xt, yt)
    dev.synchronize()
    t4 = time.perf_counter()
    if device.startswith("opencl"):  # build workers kept for later plans exit now, so their CPU time is counted
        getattr(opencl_build, "_close_all", lambda: None)()
    build_s = plans.seconds
    return {
        "import_s": t1 - t0,
        "model_s": t2 - t1,
        "python_s": t3 - t2 - build_s,
        "kernel_build_s": build_s,
        "plans": plans.calls,
        "plan_kernels": plans.items,
        "workers_s": workers.seconds if workers else 0.0,
        "worker_kernels": workers.items if workers else 0,
        "in_process_s": in_process.seconds if in_process else 0.0,
        "in_process_builds": in_process.calls if in_process else 0,
        "first_run_s": t4 - t3,
        "first_call_s": t4 - t2,
        "plan_log": plans.log,
        "worker_log": workers.log if workers else [],
        "calls": "/".join(f"{c:.2f}" for c in calls),
        "compiler_cpu_s": sum(
            getattr(resource.getrusage(resource.RUSAGE_CHILDREN), f) for f in ("ru_utime", "ru_stime")
        ),
        "total_s": t4 - t0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", choices=("infer", "train"), default="infer")
    p.add_argument("--cold-only", action="store_true", help="skip the warm-cache run")
    p.add_argument("--driver-cache", action="store_true", help="keep NVIDIA's JIT cache (CUDA_CACHE_PATH) as it is")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.device, args.batch, args.mode)))
        return
    rows = []
    print(
        f"{args.mode} b{args.batch} on {args.device}, load {os.getloadavg()[0]:.2f}\n"
        "| model | cache | first call s | kernel build s | plans (kernels) | workers s (kernels) "
        "| in-process s (builds) | compiler CPU s | python s | first run s | model s | import s | step calls s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="plait-compile-") as cache:
            for state in ("cold",) if args.cold_only else ("cold", "warm"):
                env = {**os.environ, "PLAIT_CACHE_DIR": cache}
                if not args.driver_cache:
                    env["CUDA_CACHE_PATH"] = os.path.join(cache, "nv")
                cmd = [sys.executable, __file__, "--child", model, "--device", args.device, "--batch", str(args.batch)]
                out = subprocess.run([*cmd, "--mode", args.mode], env=env, capture_output=True, text=True, check=True)
                row = {"model": model, "cache": state, **json.loads(out.stdout.strip().splitlines()[-1])}
                rows.append(row)
                print(
                    f"| {model} | {state} | {row['first_call_s']:.2f} | {row['kernel_build_s']:.2f} "
                    f"| {row['plans']} ({row['plan_kernels']}) | {row['workers_s']:.2f} ({row['worker_kernels']}) "
                    f"| {row['in_process_s']:.2f} ({row['in_process_builds']}) | {row['compiler_cpu_s']:.2f} "
                    f"| {row['python_s']:.2f} | {row['first_run_s']:.2f} | {row['model_s']:.2f} | {row['import_s']:.2f} "
                    f"| {row['calls']} |",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {"device": args.device, "batch": args.batch, "mode": args.mode, "load": os.getloadavg(), "rows": rows},
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
