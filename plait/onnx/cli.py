"""`plait run model.onnx --input name=file.npy ... --device cpu`: run an ONNX model, print output names, shapes
and timing, and write the outputs to an .npz file."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from plait.errors import PlaitError


class CliInputError(PlaitError, ValueError):
    """A malformed --input flag or an unreadable .npy file."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run an ONNX model on a device and save its outputs")
    p.add_argument("model", help="path to the .onnx file (external data next to it)")
    p.add_argument(
        "--input",
        "-i",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input array from a .npy file (repeat per input)",
    )
    p.add_argument("--device", default=None, help="plait device (default: PLAIT_DEVICE or the best available)")
    p.add_argument("--output", "-o", default=None, help="the .npz file to write (default: <model>.outputs.npz)")
    p.add_argument("--repeat", type=int, default=10, help="timed runs after the first (compiling) one")
    p.set_defaults(fn=run)


def _feed(specs: list[str]) -> dict[str, np.ndarray]:
    feed = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise CliInputError(f"--input {spec!r}: expected NAME=FILE.npy")
        try:
            feed[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise CliInputError(f"--input {name}: cannot read {file!r} as a .npy array ({e})") from None
    return feed


def run(args: argparse.Namespace) -> int:
    from plait.onnx.session import InferenceSession

    feed = _feed(args.input)
    t0 = time.perf_counter()
    sess = InferenceSession(args.model, device=args.device)
    outs = sess.run(None, feed)
    first = time.perf_counter() - t0
    times = []
    for _ in range(max(args.repeat, 0)):
        t = time.perf_counter()
        outs = sess.run(None, feed)
        times.append(time.perf_counter() - t)
    arrays = _named([o.name for o in sess.get_outputs()], outs)
    print(f"model {args.model} on {sess.device}")
    for name, arr in arrays.items():
        print(f"  {name}: shape {tuple(arr.shape)} {arr.dtype}")
    print(f"load + compile + first run: {first * 1e3:.1f} ms")
    if times:
        print(f"run: median {np.median(times) * 1e3:.3f} ms, min {min(times) * 1e3:.3f} ms over {len(times)} runs")
    out = Path(args.output) if args.output else Path(args.model).with_suffix(".outputs.npz")
    np.savez(out, **arrays)  # type: ignore[arg-type]
    print(f"outputs written to {out}")
    return 0


def _named(names: list[str], outs: list[Any]) -> dict[str, np.ndarray]:
    """Outputs by name; a sequence output's elements are NAME[0], NAME[1]..., an empty optional is left out."""
    arrays: dict[str, np.ndarray] = {}
    for name, v in zip(names, outs, strict=True):
        if isinstance(v, list):
            arrays.update({f"{name}[{i}]": a for i, a in enumerate(v)})
        elif v is not None:
            arrays[name] = v
    return arrays
