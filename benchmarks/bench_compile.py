"""First-compile and warm-cache compile time of the bench models: where the time of `plait.jit`'s first call goes.

Each (model, cache state) runs in a fresh Python process, so nothing is remembered in memory between them; the cold
run gets an empty PLAIT_CACHE_DIR, the warm run then reuses that folder. The first call is split into building the
plait model (weights), tracing + scheduling + rendering (Python), building the kernels (the device compiler: gcc on
cpu, the OpenCL driver on GPUs) and the first execution; "compiler CPU s" is the CPU time of the compiler processes
(gcc; 0 for OpenCL, whose driver builds in-process), which does not depend on how busy the machine is.

    python benchmarks/bench_compile.py --device cpu --models alexnet,resnet18,resnet50,vgg16,mobilenet_v2
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

MODELS = ("alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2")


def measure(model: str, device: str, batch: int) -> dict[str, float]:
    """One model's first call in this (fresh) process, in seconds per stage."""
    t0 = time.perf_counter()
    import plait
    from plait.bench.models import get
    from plait.schedule import plan as plan_mod

    spec = get(model)
    t1 = time.perf_counter()
    net = spec.plait_factory(device).eval()
    x, _ = spec.inputs(batch)
    t2 = time.perf_counter()
    build_s = 0.0
    compile_fn = plan_mod._compile

    def timed_compile(*args: object) -> object:
        nonlocal build_s
        s = time.perf_counter()
        try:
            return compile_fn(*args)  # type: ignore[arg-type]
        finally:
            build_s += time.perf_counter() - s

    plan_mod._compile = timed_compile  # type: ignore[assignment]  # this process only: split Python from compiler
    f = plait.jit(lambda t: net(t), device=device)
    f.plan_for([x])
    t3 = time.perf_counter()
    f(x)
    plait.runtime.get_device(device).synchronize()
    t4 = time.perf_counter()
    return {
        "import_s": t1 - t0,
        "model_s": t2 - t1,
        "python_s": t3 - t2 - build_s,
        "kernel_build_s": build_s,
        "first_run_s": t4 - t3,
        "first_call_s": t4 - t2,
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
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.device, args.batch)))
        return
    rows = []
    print(
        "| model | cache | first call s | kernel build s | compiler CPU s | python s | first run s | model s | import s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="plait-compile-") as cache:
            for state in ("cold", "warm"):
                env = {**os.environ, "PLAIT_CACHE_DIR": cache}
                cmd = [sys.executable, __file__, "--child", model, "--device", args.device, "--batch", str(args.batch)]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
                row = {"model": model, "cache": state, **json.loads(out.strip().splitlines()[-1])}
                rows.append(row)
                print(
                    f"| {model} | {state} | {row['first_call_s']:.2f} | {row['kernel_build_s']:.2f} "
                    f"| {row['compiler_cpu_s']:.2f} "
                    f"| {row['python_s']:.2f} | {row['first_run_s']:.2f} | {row['model_s']:.2f} | {row['import_s']:.2f} |",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": args.device, "batch": args.batch, "load": os.getloadavg(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
