"""How fast an OpenCL driver builds one plan's kernels, built in different ways: where a cold first compile goes.

The kernels of a bench model's inference plan are captured once (rendered for the device, not built), then each way
of building them runs in a fresh process with an empty plait cache (and, on NVIDIA, CUDA_CACHE_DISABLE=1 unless the
variant says otherwise), so no build is served from a cache:

- serial: one program per kernel, one after another (each kernel's own build time, by kernel kind);
- plait: `OpenCLDevice.compile_batch`, what plans do (worker processes on NVIDIA with the JIT cache on);
- plait-threads: `compile_batch` without worker processes (one joined program per core, from threads);
- threads: one program per kernel from a thread pool sharing one context;
- processes: worker processes build source to binaries, the parent loads the binaries (split into the two phases);
- processes-jitcache: the same with the driver's own JIT cache on (a fresh CUDA_CACHE_PATH shared by the workers
  and the parent), as a machine with default settings runs it.

    python benchmarks/bench_cl_build.py --device opencl:0 --model resnet50 --batch 64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

VARIANTS = ("plait-jitcache", "plait-threads-jitcache", "plait", "processes-jitcache", "processes", "threads", "serial")
SERIAL_CAP_S = 15.0


class _Captured(Exception):
    pass


def capture(model: str, batch: int, device: str, path: str) -> None:
    """Write the (source, name) pairs of the model's inference plan to `path` without building them."""
    import plait
    from plait.bench.models import get
    from plait.schedule import plan as plan_mod

    spec = get(model)
    net = spec.plait_factory(device).eval()
    x, _ = spec.inputs(batch)
    kernels: list[tuple[str, str]] = []

    def record(_device: Any, rendered: list[Any], _items: list[Any]) -> list[Any]:
        kernels.extend((k.source, k.name) for k in rendered)
        raise _Captured

    plan_mod._compile = record  # type: ignore[assignment]  # this process only
    try:
        plait.jit(lambda t: net(t), device=device).plan_for([x])
    except _Captured:
        pass
    unique = list(dict((name, (src, name)) for src, name in kernels).values())
    with open(path, "w") as fh:
        json.dump(unique, fh)


_worker: dict[str, Any] = {}


def _worker_init(index: int) -> None:
    import pyopencl as cl

    from plait.runtime.opencl import discover

    dev = next(d for n, d, _ in discover() if n == f"opencl:{index}")
    _worker["cl"], _worker["dev"], _worker["ctx"] = cl, dev, cl.Context([dev])


def _worker_build(src: str) -> bytes:
    cl = _worker["cl"]
    prog = cl.Program(_worker["ctx"], src).build()
    return bytes(prog.get_info(cl.program_info.BINARIES)[0])


def _kind(name: str) -> str:
    return name.split("_", 1)[0]


def child(variant: str, device: str, path: str) -> dict[str, Any]:
    """Build the captured kernels one way in this fresh process; seconds per phase."""
    import warnings

    import pyopencl as cl

    from plait.runtime import get_device

    warnings.simplefilter("ignore", cl.CompilerWarning)
    with open(path) as fh:
        kernels = [tuple(k) for k in json.load(fh)]
    dev = get_device(device)
    ctx, cdev = dev.ctx, dev.dev
    workers = os.cpu_count() or 1
    out: dict[str, Any] = {"variant": variant, "kernels": len(kernels), "workers": workers}
    t0 = time.perf_counter()
    if variant == "serial":  # stops after SERIAL_CAP_S: enough kernels of each kind to see their build times
        per_kind: dict[str, list[float]] = defaultdict(list)
        for src, name in kernels:
            if time.perf_counter() - t0 > SERIAL_CAP_S:
                break
            s = time.perf_counter()
            cl.Program(ctx, src).build()
            per_kind[_kind(name)].append(time.perf_counter() - s)
        out["per_kind"] = {k: [len(v), round(sum(v), 3), round(max(v), 3)] for k, v in per_kind.items()}
    elif variant in ("plait", "plait-threads"):
        if variant == "plait-threads":
            from plait.runtime import opencl_build

            opencl_build.workers_help = lambda _dev: False  # type: ignore[assignment]  # this process only
        dev.compile_batch(kernels)
    elif variant == "threads":
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda k: cl.Program(ctx, k[0]).build(), kernels))
    else:
        import multiprocessing

        index = int(device.split(":")[1])
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=spawn, initializer=_worker_init, initargs=(index,)) as pool:
            list(pool.map(int, range(workers)))  # start the workers (imports, contexts) before timing builds
            out["pool_start_s"] = round(time.perf_counter() - t0, 3)
            s = time.perf_counter()
            binaries = list(pool.map(_worker_build, [src for src, _ in kernels]))
            out["worker_build_s"] = round(time.perf_counter() - s, 3)
        s = time.perf_counter()
        for binary in binaries:
            cl.Program(ctx, [cdev], [binary]).build()
        out["load_binaries_s"] = round(time.perf_counter() - s, 3)
    out["total_s"] = round(time.perf_counter() - t0, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="opencl:0")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--capture", help=argparse.SUPPRESS)
    p.add_argument("--kernels", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.capture:
        capture(args.model, args.batch, args.device, args.capture)
        return
    if args.child:
        print(json.dumps(child(args.child, args.device, args.kernels)))
        return
    with tempfile.TemporaryDirectory(prefix="plait-build-") as tmp:
        path = os.path.join(tmp, "kernels.json")
        base = [sys.executable, __file__, "--device", args.device]
        env = {**os.environ, "PLAIT_CACHE_DIR": os.path.join(tmp, "capture")}
        subprocess.run(
            [*base, "--model", args.model, "--batch", str(args.batch), "--capture", path], env=env, check=True
        )
        for i, variant in enumerate(args.variants.split(",")):
            env = {**os.environ, "PLAIT_CACHE_DIR": os.path.join(tmp, f"cache{i}")}
            if variant.endswith("jitcache"):
                env.pop("CUDA_CACHE_DISABLE", None)
                env["CUDA_CACHE_PATH"] = os.path.join(tmp, f"nv{i}")
            else:
                env["CUDA_CACHE_DISABLE"] = "1"
            run = subprocess.run(
                [*base, "--child", variant.removesuffix("-jitcache"), "--kernels", path],
                env=env,
                capture_output=True,
                text=True,
            )
            line = run.stdout.strip().splitlines()[-1] if run.returncode == 0 else run.stderr[-800:]
            print(f"{args.model} b{args.batch} {variant}: {line}", flush=True)


if __name__ == "__main__":
    main()
