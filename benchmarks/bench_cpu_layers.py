"""Per-layer CPU time of a benchmark CNN's convolutions on plait's `cpu` device against ONNX Runtime, one thread each.

Every distinct convolution of the net (found by running the torch reference model with forward hooks) becomes a
one-layer model, conv + bias + ReLU with random weights: for ONNX Runtime an ONNX graph with the weights as
initializers (CPU provider, one intra-op thread, all graph optimisations), for plait a `plait.jit` plan with the
weights as constants, as in a jit'ed model. Each is timed by the calling thread's CPU time (`time.thread_time`,
best of `--repeats`), which other jobs on a shared machine barely move, and weighted by how often the layer occurs:

    PLAIT_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_cpu_layers.py resnet50 --batch 1

Also prints the whole net's one-thread CPU time in both frameworks (ORT on the exported model, plait on its twin).
The one-layer ORT models pay layout reorders that ORT's optimiser removes between convolutions of a whole net (NCHWc),
so `--by-shape` compares the whole nets per convolution output shape instead (ORT's per-node profile).
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PLAIT_NUM_THREADS", "1")

import numpy as np
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

import plait
import plait.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_onnx import MODELS, export, reference, twin

# (in channels, out channels, kernel, stride, padding, input height, input width)
Layer = tuple[int, int, int, int, int, int, int]


def conv_layers(name: str) -> collections.Counter[Layer]:
    """Every ungrouped convolution of the torch reference net with how often it occurs."""
    net = reference(name)
    seen: collections.Counter[Layer] = collections.Counter()

    def hook(mod: torch.nn.Module, inp: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        assert isinstance(mod, torch.nn.Conv2d)
        if mod.groups == 1:
            h, w = inp[0].shape[2:]
            kh, s, p = mod.kernel_size[0], mod.stride[0], mod.padding
            assert isinstance(p, tuple)
            seen[(mod.in_channels, mod.out_channels, kh, s, p[0], h, w)] += 1

    for m in net.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        net(torch.zeros(1, 3, 224, 224))
    return seen


def best_cpu(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Fewest thread CPU seconds of `repeats` calls of each function (after one untimed call), the functions called
    in turn so that a busy spell of the machine hits all of them alike."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.thread_time()
            fn()
            best[i] = min(best[i], time.thread_time() - t0)
    return best


def ort_session(model: bytes) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])


def ort_layer(layer: Layer, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> ort.InferenceSession:
    """A Conv + Relu ONNX graph with the weights as initializers."""
    _, _, k, s, p, _, _ = layer
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort_session(model.SerializeToString())


def plait_layer(layer: Layer, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> Callable[[], object]:
    """One replay of the conv + bias + ReLU plan's kernels (the plan has run once on `x`)."""
    _, _, _, s, p, _, _ = layer
    wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")
    f = plait.jit(lambda t: F.conv2d(t, wt, bt, stride=s, padding=p).relu(), device="cpu")
    plan, _ = f.plan_for([x])
    f(x)
    return lambda: [launch() for launch in plan.launches]


def per_layer(name: str, batch: int, repeats: int) -> None:
    """The table of one-layer models, plait against ORT."""
    print("| Ci | Co | k | s | HxW | count | plait ms | ORT ms | plait / ORT | plait GFLOP/s | ORT GFLOP/s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    sums = [0.0, 0.0]
    for layer, count in sorted(conv_layers(name).items(), key=lambda kv: (-kv[0][5], kv[0][:5])):
        ci, co, k, s, p, h, wd = layer
        x = rng.standard_normal((batch, ci, h, wd)).astype(np.float32)
        w = (rng.standard_normal((co, ci, k, k)) * (2.0 / (ci * k * k)) ** 0.5).astype(np.float32)
        b = rng.standard_normal(co).astype(np.float32) * 0.1
        sess = ort_layer(layer, x, w, b)
        t_pl, t_ort = best_cpu([plait_layer(layer, x, w, b), functools.partial(sess.run, None, {"x": x})], repeats)
        oh, ow = (h + 2 * p - k) // s + 1, (wd + 2 * p - k) // s + 1
        flop = 2.0 * batch * co * oh * ow * ci * k * k
        sums[0] += t_pl * count
        sums[1] += t_ort * count
        print(
            f"| {ci} | {co} | {k} | {s} | {h}x{wd} | {count} | {t_pl * 1e3:.2f} | {t_ort * 1e3:.2f} |"
            f" {t_pl / t_ort:.2f} | {flop / t_pl / 1e9:.0f} | {flop / t_ort / 1e9:.0f} |"
        )
    print(f"convolutions weighted by count: plait {sums[0] * 1e3:.1f} ms, ORT {sums[1] * 1e3:.1f} ms")


def whole_net(name: str, batch: int, repeats: int) -> None:
    """Whole-net CPU time: ORT on the exported model against plait's twin, interleaved."""
    x = np.random.default_rng(1).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    sess = ort_session(export(name))
    f = twin(name, "cpu")
    plan, _ = f.plan_for([x])
    f(x)
    t_pl, t_ort = best_cpu([lambda: [launch() for launch in plan.launches], lambda: sess.run(None, {"x": x})], repeats)
    print(f"whole net: plait twin {t_pl * 1e3:.1f} ms, ORT {t_ort * 1e3:.1f} ms, plait / ORT {t_pl / t_ort:.2f}")


def by_shape(name: str, batch: int, repeats: int) -> None:
    """The whole nets side by side per convolution output shape: ONNX Runtime's own per-node profile of the exported
    model (as its optimiser rewrites it, NCHWc convolutions with fused adds and ReLUs; the fewest microseconds of each
    node over `repeats` runs, wall time of one thread) against plait's twin plan, each kernel's fewest thread CPU
    seconds over as many whole replays. Unlike the one-layer models, ORT pays no layout reorders around each convolution
    here; but its node times are wall time, so only a quiet machine gives comparable columns."""
    x = np.random.default_rng(1).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "ort")
    sess = ort.InferenceSession(export(name), opts, providers=["CPUExecutionProvider"])
    for _ in range(repeats):
        sess.run(None, {"x": x})
    best: dict[str, tuple[float, tuple[int, int]]] = {}
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        args = e.get("args", {})
        if e.get("cat") == "Node" and args.get("op_name") == "Conv" and e["name"].endswith("_kernel_time"):
            shape = next(iter(args["output_type_shape"][0].values()))
            old = best.get(e["name"], (float("inf"), (0, 0)))
            best[e["name"]] = (min(old[0], e["dur"] / 1e3), (shape[1], shape[2] * shape[3]))
    ort_ms: collections.defaultdict[tuple[int, int], float] = collections.defaultdict(float)
    for t, key in best.values():
        ort_ms[key] += t
    f = twin(name, "cpu")
    plan, _ = f.plan_for([x])
    f(x)
    plait_ms: collections.defaultdict[tuple[int, int], float] = collections.defaultdict(float)
    # each kernel timed inside whole replays, as ORT's nodes are, so its weights come from where a replay leaves them
    kernel_best = [float("inf")] * len(plan.launches)
    for _ in range(repeats):
        for i, launch in enumerate(plan.launches):
            t0 = time.thread_time()
            launch()
            kernel_best[i] = min(kernel_best[i], time.thread_time() - t0)
    other: collections.Counter[str] = collections.Counter()
    for kernel, t in zip(plan.kernels, kernel_best, strict=True):
        kind, dims = kernel.name.split("_")[:2]
        if kind not in ("GEMM", "CONV", "WINO2", "WINO4"):
            other[f"{kind} {dims}"] += round(t * 1e6)
            continue
        _, m, n, _ = (int(v) for v in dims.split("x"))
        plait_ms[(m, n // batch if kind == "GEMM" and batch > 1 and n % batch == 0 else n)] += 1e3 * t
    print("| out channels | H*W | ORT ms | plait ms | plait / ORT |")
    print("| --- | --- | --- | --- | --- |")
    for key in sorted(set(ort_ms) | set(plait_ms), key=lambda k: (-k[1], k[0])):
        ratio = f"{plait_ms[key] / ort_ms[key]:.2f}" if ort_ms[key] else "-"
        print(f"| {key[0]} | {key[1]} | {ort_ms[key]:.2f} | {plait_ms[key]:.2f} | {ratio} |")
    print(f"all convolutions: ORT {sum(ort_ms.values()):.1f} ms, plait {sum(plait_ms.values()):.1f} ms")
    print(f"plait's other kernels (us): {dict(other.most_common())}; all kernels {sum(kernel_best) * 1e3:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-whole", action="store_true", help="skip the whole-net times")
    ap.add_argument("--by-shape", action="store_true", help="whole nets per convolution output shape instead")
    args = ap.parse_args()
    print(f"{args.model} b{args.batch}, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    if args.by_shape:
        by_shape(args.model, args.batch, args.repeats)
    else:
        per_layer(args.model, args.batch, args.repeats)
    if not args.no_whole:
        whole_net(args.model, args.batch, args.repeats)
    print(f"load average at the end {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()
