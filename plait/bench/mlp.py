"""The quick benchmark: a small multilayer perceptron on a plait device next to NumPy, outputs checked first."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from plait.bench.timing import measure
from plait.errors import PlaitError


def run_mlp(device: str, batch: int = 64, sizes: tuple[int, ...] = (784, 1024, 1024, 10), iters: int = 20) -> dict[str, Any]:
    import plait

    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32) for a, b in itertools.pairwise(sizes)]
    bs = [rng.standard_normal(b).astype(np.float32) * 0.1 for b in sizes[1:]]
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)

    def ref(x: np.ndarray) -> np.ndarray:
        for i, (w, b) in enumerate(zip(ws, bs)):
            x = x @ w + b
            if i < len(ws) - 1:
                x = np.maximum(x, 0)
        return x

    wt = [plait.tensor(w, device=device) for w in ws]
    bt = [plait.tensor(b, device=device) for b in bs]

    def model(x: Any) -> Any:
        for i, (w, b) in enumerate(zip(wt, bt)):
            x = x @ w + b
            if i < len(wt) - 1:
                x = x.relu()
        return x

    f = plait.jit(model, device=device)
    got, want = f(x), ref(x)
    err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-12))
    if err > 1e-4:
        raise PlaitError(f"mlp on {device}: output differs from NumPy (relative error {err:.2e}); not timing it")
    t_plait = measure(lambda: f(x), iters=iters)
    t_numpy = measure(lambda: ref(x), iters=iters)
    flops = 2 * batch * sum(a * b for a, b in itertools.pairwise(sizes))
    return {
        "model": f"mlp{'-'.join(map(str, sizes))}", "batch": batch, "device": device, "max_rel_err": err,
        "plait_ms": t_plait["median_ms"], "numpy_ms": t_numpy["median_ms"],
        "plait_gflops": flops / t_plait["median_ms"] / 1e6, "speedup_vs_numpy": t_numpy["median_ms"] / t_plait["median_ms"],
        "timing": {"plait": t_plait, "numpy": t_numpy},
    }
