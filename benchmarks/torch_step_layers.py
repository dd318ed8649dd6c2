"""PyTorch's training step layer by layer: the step `plait bench --modes train` times on the torch side (the same
model, weights, inputs, SGD without momentum, dropout frozen, gradients set to None), run under torch.profiler, with
every kernel charged to the layer and phase that launched it, so that it reads beside plait's per-kernel report
(benchmarks/profile_step.py) and shows where cuDNN/cuBLAS beat plait's kernels.

    tools/gpu-run.sh python3 benchmarks/torch_step_layers.py --models alexnet --batch 64

Forward kernels belong to the leaf module whose forward hook range encloses their launch. Backward kernels belong to
the autograd function that launched them, and through its sequence number to the forward op (and module) that made
it. The loss's and the optimizer's kernels have their own rows. On `--device cpu` the "kernels" are the leaf aten
ops, timed on the host (a smoke test of the attribution, not a measurement).
"""

from __future__ import annotations

import argparse
import bisect
import json
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

_KERNEL_CATS = ("kernel", "gpu_memset", "gpu_memcpy")


@dataclass
class _Thread:
    """The host ranges of one thread: (start, end, label) lists of annotations and of cpu ops, sorted by start."""

    notes: list[tuple[float, float, str]] = field(default_factory=list)
    ops: list[tuple[float, float, dict[str, Any]]] = field(default_factory=list)


def _enclosing(ranges: list[Any], ts: float) -> list[Any]:
    """The ranges that contain `ts`, outermost first (ranges sorted by start; nested ranges start later)."""
    i = bisect.bisect_right([r[0] for r in ranges], ts)
    return [r for r in ranges[:i] if r[1] >= ts]


def _module_hooks(model: Any, torch: Any) -> None:
    """Wrap every leaf module's forward in a profiler range named 'fwd <module name>'."""
    for name, mod in model.named_modules():
        if next(mod.children(), None) is not None:
            continue
        stack: list[Any] = []

        def pre(_m: Any, _a: Any, name: str = name, stack: list[Any] = stack) -> None:
            rf = torch.autograd.profiler.record_function(f"fwd {name}")
            rf.__enter__()
            stack.append(rf)

        def post(_m: Any, _a: Any, _o: Any, stack: list[Any] = stack) -> None:
            stack.pop().__exit__(None, None, None)

        mod.register_forward_pre_hook(pre)
        mod.register_forward_hook(post)


def attribute(events: list[dict[str, Any]], on_gpu: bool) -> list[tuple[str, str, float]]:
    """(row, kernel name, microseconds) for every kernel of a chrome trace: row is 'fwd <module>', 'bwd <module>
    <autograd function>', 'loss', 'update' or 'other <op>'."""
    threads: dict[tuple[Any, Any], _Thread] = defaultdict(_Thread)
    launches: dict[Any, tuple[tuple[Any, Any], float]] = {}
    kernels: list[dict[str, Any]] = []
    for ev in events:
        cat, key = ev.get("cat"), (ev.get("pid"), ev.get("tid"))
        if ev.get("ph") != "X":
            continue
        span = (float(ev["ts"]), float(ev["ts"]) + float(ev.get("dur", 0)))
        if cat == "user_annotation":
            threads[key].notes.append((*span, ev["name"]))
        elif cat == "cpu_op":
            threads[key].ops.append((*span, ev))
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in ev.get("args", {}):
            launches[ev["args"]["correlation"]] = (key, span[0])
        elif cat in _KERNEL_CATS:
            kernels.append(ev)
    for th in threads.values():
        th.notes.sort(key=lambda r: (r[0], -r[1]))
        th.ops.sort(key=lambda r: (r[0], -r[1]))
    if not on_gpu:  # leaf aten ops stand in for kernels, launched where they run
        for key, th in threads.items():
            for k, (s, e, ev) in enumerate(th.ops):
                nxt = th.ops[k + 1][0] if k + 1 < len(th.ops) else float("inf")
                if ev["name"].startswith("aten::") and nxt >= e:
                    kernels.append({**ev, "args": {"correlation": id(ev)}})
                    launches[id(ev)] = (key, s + 1e-3)
    seq_module: dict[int, str] = {}
    for th in threads.values():
        for s, _e, ev in th.ops:
            seq = ev.get("args", {}).get("Sequence number")
            notes = [n[2] for n in _enclosing(th.notes, s) if n[2].startswith("fwd ") or n[2] == "loss"]
            if seq is not None and notes and not ev["name"].startswith("autograd::"):
                seq_module.setdefault(int(seq), notes[-1].removeprefix("fwd "))
    rows = []
    for k in kernels:
        where = launches.get(k.get("args", {}).get("correlation"))
        rows.append((_row(threads, where, seq_module) if where else "other ?", k["name"], float(k.get("dur", 0))))
    return rows


def _row(threads: dict[Any, _Thread], where: tuple[Any, float], seq_module: dict[int, str]) -> str:
    key, ts = where
    th = threads[key]
    notes = [n[2] for n in _enclosing(th.notes, ts)]
    for n in reversed(notes):
        if n.startswith("fwd "):
            return n
        if n == "loss" or n.startswith("Optimizer.step"):
            return "update" if n.startswith("Optimizer") else "loss"
    ops = [o[2] for o in _enclosing(th.ops, ts)]
    for ev in ops:
        if ev["name"].startswith("autograd::engine::evaluate_function: "):
            fn = ev["name"].split(": ", 1)[1]
            seq = ev.get("args", {}).get("Sequence number")
            mod = seq_module.get(int(seq)) if seq is not None else None
            return f"bwd {mod or '(no module)'} {fn}"
    return "other " + (ops[-1]["name"] if ops else "?")


def main() -> None:
    import copy

    import torch
    from torch.profiler import ProfilerActivity, profile

    from plait.bench.models import get
    from plait.bench.runners import freeze_dropout

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="alexnet")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=5, help="profiled steps, after 5 warm-up steps")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--image", type=int, default=0, help="square image side instead of the model's own (smoke tests)")
    ap.add_argument("--kernels", action="store_true", help="also list each row's kernels")
    args = ap.parse_args()
    on_gpu = args.device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    for name in args.models.split(","):
        spec = get(name)
        torch.manual_seed(0)
        model = copy.deepcopy(spec.torch_factory()).to(args.device).train()
        freeze_dropout(model)
        x_np, y_np = spec.inputs(args.batch)
        if args.image:
            x_np = x_np[:, :, : args.image, : args.image].copy()
        x, y = torch.from_numpy(x_np).to(args.device), torch.from_numpy(y_np).to(args.device)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        loss_fn = torch.nn.CrossEntropyLoss()

        def step(model: Any = model, opt: Any = opt, loss_fn: Any = loss_fn, x: Any = x, y: Any = y) -> None:
            opt.zero_grad(set_to_none=True)
            out = model(x)
            with torch.autograd.profiler.record_function("loss"):
                loss = loss_fn(out, y)
            loss.backward()
            opt.step()

        for _ in range(5):
            step()
        _module_hooks(model, torch)
        if on_gpu:
            torch.cuda.synchronize()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with profile(activities=acts) as prof:
            for _ in range(args.steps):
                step()
            if on_gpu:
                torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            events = json.load(open(f.name))["traceEvents"]
        per: dict[str, list[tuple[str, float]]] = defaultdict(list)
        order: list[str] = []
        for row, kname, us in attribute(events, on_gpu):
            if row not in per:
                order.append(row)
            per[row].append((kname, us))
        total = sum(us for v in per.values() for _, us in v) / args.steps / 1e3
        print(
            f"== torch {name} b{args.batch} on {args.device}: {total:.3f} ms of kernels per step ({args.steps} steps)"
        )
        print("| row | kernels per step | ms per step |")
        print("|---|---|---|")
        for row in order:
            ks = per[row]
            print(f"| {row} | {len(ks) / args.steps:g} | {sum(us for _, us in ks) / args.steps / 1e3:.3f} |")
            if args.kernels:
                byk: dict[str, float] = defaultdict(float)
                for kname, us in ks:
                    byk[kname] += us / args.steps / 1e3
                for kname, ms in sorted(byk.items(), key=lambda kv: -kv[1]):
                    print(f"|   {kname[:110]} | | {ms:.3f} |")


if __name__ == "__main__":
    main()
