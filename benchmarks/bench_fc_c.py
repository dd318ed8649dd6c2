"""alexnet's three classifier layers (linear + bias, ReLU on the first two) on plait's `cpu` device against ONNX
Runtime, layer by layer, at a batch of 1 and 16.

plait runs a `plait.jit` plan with the weight as a constant (as in the twin and the ONNX path: the (out, in) weight
read in place); ORT a Gemm(transB=1) + Relu graph with the weight as an initializer (which it may prepack). With one
thread each layer is timed by the calling thread's CPU time (best of --repeats, the two called in turn); with two
threads (--threads 2, both frameworks) by wall time, medians over interleaved rounds. The weight streamed per call
is printed as GB/s: these layers are bound by reading the weights once.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_fc_c.py --threads 2 --batch 16 --repeats 30
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_THREADS = sys.argv[sys.argv.index("--threads") + 1] if "--threads" in sys.argv else "1"
os.environ.setdefault("OMP_NUM_THREADS", _THREADS)
os.environ.setdefault("PLAIT_NUM_THREADS", _THREADS)

from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import plait  # noqa: E402
import plait.nn.functional as F  # noqa: E402

LAYERS = ((9216, 4096, True), (4096, 4096, True), (4096, 1000, False))  # alexnet's fc1, fc2, fc3


def ort_fc(x: np.ndarray, w: np.ndarray, b: np.ndarray, relu: bool, threads: int) -> ort.InferenceSession:
    """A Gemm(transB=1) [+ Relu] ONNX graph with the weight and bias as initializers."""
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g" if relu else "y"], transB=1)]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "fc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def plait_fc(x: np.ndarray, w: np.ndarray, b: np.ndarray, relu: bool) -> tuple[Callable[[], object], np.ndarray]:
    """One replay of the linear layer's plan kernels (after one checked call), and the layer's output."""
    wt, bt = plait.tensor(w, device="cpu"), plait.tensor(b, device="cpu")

    def layer(t: plait.Tensor) -> plait.Tensor:
        y = F.linear(t, wt, bt)
        return y.relu() if relu else y

    f = plait.jit(layer, device="cpu")
    plan, _ = f.plan_for([x])
    out = np.asarray(f(x))
    return (lambda: [launch() for launch in plan.launches]), out


def timed(fns: list[Callable[[], object]], repeats: int, clock: Callable[[], float]) -> list[list[float]]:
    """Seconds of each call by `clock`, the functions called in turn `repeats` times (after one untimed call each)."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = clock()
            fn()
            times[i].append(clock() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--threads", type=int, default=1, choices=(1, 2))
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    one = args.threads == 1
    clock = time.thread_time if one else time.perf_counter
    print(f"threads {args.threads}, {'best thread CPU time' if one else 'median wall time'}, load {os.getloadavg()}")
    print("| batch | layer | plait ms | ORT ms | plait / ORT | plait GB/s | ORT GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    rng = np.random.default_rng(0)
    for batch in args.batch:
        for k, n, relu in LAYERS:
            x = rng.standard_normal((batch, k)).astype(np.float32)
            w = (rng.standard_normal((n, k)) * (2.0 / k) ** 0.5).astype(np.float32)
            b = (rng.standard_normal(n) * 0.1).astype(np.float32)
            sess = ort_fc(x, w, b, relu, args.threads)
            run, out = plait_fc(x, w, b, relu)
            np.testing.assert_allclose(out, sess.run(None, {"x": x})[0], rtol=1e-3, atol=1e-3)
            t = timed([run, lambda s=sess, x=x: s.run(None, {"x": x})], args.repeats, clock)
            pl, ox = (min(v) if one else float(np.median(v)) for v in t)
            gb = w.nbytes / 1e9
            print(
                f"| {batch} | {k}->{n} | {pl * 1e3:.2f} | {ox * 1e3:.2f} | {pl / ox:.2f} | {gb / pl:.1f} | {gb / ox:.1f} |"
            )
    print(f"load at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
