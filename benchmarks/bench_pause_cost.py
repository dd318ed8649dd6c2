"""What a pause before each call costs: plait's twin of a benchmark CNN on the cpu device and ONNX Runtime's session of
its export (two intra-op threads), each timed for `--calls` calls back to back and then with a sleep before every
call, in one process; median and fastest ms per framework and pause. `bench_onnx.py` pauses after every call (1 s
after ORT), so its medians include this cost.

    OMP_WAIT_POLICY=PASSIVE PLAIT_NUM_THREADS=2 .venv/bin/python benchmarks/bench_pause_cost.py mobilenet_v2 --batch 16
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, twin


def timed(fn: Callable[[], Any], calls: int, pause: float) -> list[float]:
    out = []
    for _ in range(calls):
        if pause:
            time.sleep(pause)
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--pauses", default="0,0.3,0,1", help="seconds of sleep before each call, per set of calls")
    args = ap.parse_args()
    import onnxruntime as ort

    x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    f = twin(args.model, "cpu")
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 2, 1
    sess = ort.InferenceSession(export(args.model), so, providers=["CPUExecutionProvider"])
    fns = {"plait": lambda: np.asarray(f(x)), "ort": lambda: sess.run(None, {"x": x})}
    for fn in fns.values():
        fn()
        fn()
    for pause in (float(p) for p in args.pauses.split(",")):
        for name, fn in fns.items():
            t = timed(fn, args.calls, pause)
            print(
                f"{args.model} b{args.batch} {name:5s} pause {pause:.1f} s: median {np.median(t):.1f} ms, fastest {min(t):.1f}"
            )


if __name__ == "__main__":
    main()
