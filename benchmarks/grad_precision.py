"""Where a training step's gradients lose float32 precision on a device: every parameter's gradient from plait and
from PyTorch float32 (on `--torch-device`) against PyTorch float64 on the cpu, layer by layer, with plait's OpenCL
kernels built as usual and under build variants (correctly rounded division and square root; no contraction of
a*b+c into fused multiply-adds), each variant in a fresh process with its own kernel cache.

    python benchmarks/grad_precision.py --model mobilenet_v2 --batch 64 --device opencl:0 --torch-device cuda
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

VARIANTS = {
    "as-built": "",
    "div-sqrt": "-cl-fp32-correctly-rounded-divide-sqrt",
    "no-fma": "#pragma OPENCL FP_CONTRACT OFF",
}


def _case(model: str, batch: int) -> tuple[object, np.ndarray, np.ndarray, object]:
    import torch

    from plait.bench.models import get

    spec = get(model)
    torch.manual_seed(0)
    ref = spec.torch_factory()
    x, y = spec.inputs(batch)
    return spec, x, y, ref


def torch_grads(model: str, batch: int, device: str, dtype: object) -> list[np.ndarray]:
    import torch

    from plait.bench.runners import freeze_dropout

    _, x, y, ref = _case(model, batch)
    m = ref.to(device=device, dtype=dtype).train()  # type: ignore[attr-defined]
    freeze_dropout(m)
    xt = torch.from_numpy(x).to(device)
    xt = xt.to(dtype) if xt.is_floating_point() else xt
    torch.nn.CrossEntropyLoss()(m(xt), torch.from_numpy(y).to(device)).backward()
    return [p.grad.double().cpu().numpy() for p in m.parameters()]


def plait_grads(model: str, batch: int, device: str, variant: str) -> list[np.ndarray]:
    """Gradients of every parameter from plait on `device`, its OpenCL programs built under `variant`."""
    flag = VARIANTS[variant]
    if flag:
        import pyopencl as cl

        if flag.startswith("#pragma"):
            init = cl.Program.__init__

            def patched_init(self: object, ctx: object, src: object = None, *rest: object) -> None:
                init(self, ctx, flag + "\n" + src if isinstance(src, str) else src, *rest)  # type: ignore[misc]

            cl.Program.__init__ = patched_init  # type: ignore[method-assign]
        else:
            build = cl.Program.build

            def patched_build(self: object, options: object = (), *rest: object, **kw: object) -> object:
                opts = [options] if isinstance(options, str) else list(options)  # type: ignore[call-overload]
                return build(self, [*opts, flag], *rest, **kw)  # type: ignore[arg-type]

            cl.Program.build = patched_build  # type: ignore[method-assign]
    import plait
    from plait.bench.runners import freeze_dropout

    spec, x, y, ref = _case(model, batch)
    m = spec.plait_factory(device)  # type: ignore[attr-defined]
    m.load_state_dict({k: v.detach().cpu().numpy() for k, v in ref.state_dict().items()})  # type: ignore[attr-defined]
    m.train()
    freeze_dropout(m)
    xt, yt = plait.Tensor.from_numpy(x, device=device), plait.Tensor.from_numpy(y, device=device)
    plait.nn.CrossEntropyLoss()(m(xt), yt).backward()
    return [p.grad.numpy().astype(np.float64) for p in m.parameters()]


def _err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / (np.linalg.norm(b) + 1e-30))


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--torch-device", default="cpu")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default="", help="also write the whole table to this file")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        variant, out = args.child.split("=", 1)
        np.savez(out, *plait_grads(args.model, args.batch, args.device, variant))
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    exact = torch_grads(args.model, args.batch, "cpu", torch.float64)
    cols = {f"torch-{args.torch_device}": torch_grads(args.model, args.batch, args.torch_device, torch.float32)}
    with tempfile.TemporaryDirectory() as tmp:
        for v in args.variants.split(","):
            out = str(Path(tmp) / f"{v}.npz")
            env = {**os.environ, "PLAIT_CACHE_DIR": str(Path(tmp) / f"cache-{v}")}
            cmd = [sys.executable, __file__, "--model", args.model, "--batch", str(args.batch)]
            cmd += ["--device", args.device, "--child", f"{v}={out}"]
            if subprocess.run(cmd, env=env).returncode:
                print(f"variant {v}: failed")
                continue
            with np.load(out) as z:
                cols[f"plait-{v}"] = [z[f"arr_{i}"] for i in range(len(z.files))]
            _report(args.model, args.batch, exact, cols, args.out)  # after each variant: a timeout keeps the rest
    if len(cols) == 1:
        _report(args.model, args.batch, exact, cols, args.out)


def _report(model: str, batch: int, exact: list[np.ndarray], cols: dict[str, list[np.ndarray]], out: str) -> None:
    """Print (and with `out`, write) each parameter's gradient error against float64 for every column so far."""
    names = list(cols)
    lines = [f"{model} b{batch}: ||g - g_float64|| / ||g_float64|| per parameter, input side first"]
    lines.append("#   param shape".ljust(28) + "".join(n.rjust(22) for n in names))
    for i, e in enumerate(exact):
        lines.append(f"{i:<4}{e.shape!s:24}" + "".join(f"{_err(cols[n][i], e):22.2e}" for n in names))
    if out:
        Path(out).write_text("\n".join(lines) + "\n")
    step = max(1, len(exact) // 24)  # about 24 rows on the terminal, the first and last parameters always
    print(
        "\n".join(lines[:2] + [ln for i, ln in enumerate(lines[2:]) if i % step == 0 or i == len(exact) - 1]),
        flush=True,
    )


if __name__ == "__main__":
    main()
