"""Control flow, sequences and optionals: If, Loop, Scan, the Sequence* ops, SplitToSequence, ConcatFromSequence,
SequenceMap, Optional, OptionalHasElement, OptionalGetElement.

Subgraphs (If branches, Loop/Scan/SequenceMap bodies) are imported by the same importer, in a scope that sees
the enclosing graph's values (`Ctx.run_graph`), so control flow is resolved while the plan is built: If takes
one branch, Loop and Scan unroll into device ops. A control value (If's condition, Loop's trip count and
condition) must then be known on the host. When it is computed on the device from a few graph-input elements
(at most `SPECIALISE_MAX`: flags, counts, scalars), the session specialises its plan on those inputs' values,
as for Reshape's shape. When it depends on more input data than that (a condition on an image, say), the
importer does not recompile per input: If computes both branches and selects with `where`, Loop masks its
state updates with a device-side "still running" flag, and what cannot be expressed that way raises an
OnnxUnsupportedError naming the node. Unrolling is bounded by `MAX_STEPS` iterations per node.

Sequences are `SeqValue`s (tuples of values) and an empty optional is None; both exist only in the importer.
Ops here return a tuple of their outputs, so a sequence output is never mistaken for several outputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from plait.frontends.native.tensor import Tensor, cat, stack, where
from plait.graph.node import toposort
from plait.onnx.importer import Ctx, SeqValue, compute_dtype
from plait.onnx.loader import elem_np
from plait.onnx.ops import register

SPECIALISE_MAX = 64  # graph-input elements a control value may depend on for the plan to specialise on them
MAX_STEPS = 4096  # iterations one Loop, Scan or SequenceMap node may unroll into device ops


# ---------------------------------------------------------------- helpers


def _graph(ctx: Ctx, name: str) -> onnx.GraphProto:
    g = ctx.attr(name)
    if not isinstance(g, onnx.GraphProto):
        raise ctx.error(f"attribute {name} (a subgraph) is required")
    return g


def _describe(v: Any) -> str:
    if v is None:
        return "an empty optional"
    if isinstance(v, SeqValue):
        return f"a sequence of {len(v.items)}"
    dt = v.dtype if isinstance(v, Tensor) else compute_dtype(v.dtype, "value")
    return f"a tensor of shape {tuple(v.shape)} ({dt})"


def _control(ctx: Ctx, v: Any, what: str) -> np.ndarray | None:
    """The host value of control input `v`, or None when it is computed on the device from more than
    SPECIALISE_MAX elements of graph inputs (specialising the plan on those would recompile for every input).
    A value computed from fewer input elements raises NeedValue through `ctx.host`: the session specialises."""
    if v is None:
        raise ctx.error(f"input {what} is required")
    if isinstance(v, SeqValue):
        raise ctx.error(f"input {what} must be a tensor, got {_describe(v)}")
    if isinstance(v, Tensor) and v.node.op != "buffer":
        feeds = [n for n in toposort([v.node]) if n.uid in ctx.imp.input_names]
        if sum(math.prod(n.shape) for n in feeds) > SPECIALISE_MAX:
            return None
    return ctx.host(v, what)


def _truth(ctx: Ctx, arr: np.ndarray, what: str) -> bool:
    if arr.size != 1:
        raise ctx.error(f"{what} must hold one element, got shape {arr.shape}")
    return bool(arr.reshape(-1)[0])


def _flag(ctx: Ctx, v: Any, what: str) -> Tensor:
    """Device condition `v` as a bool scalar tensor."""
    t = ctx.t(v)
    if math.prod(t.shape) != 1:
        raise ctx.error(f"{what} must hold one element, got shape {t.shape}")
    return t.reshape(()).astype("bool")


def _select(ctx: Ctx, cond: Tensor, a: Any, b: Any, what: str) -> Tensor:
    """where(cond, a, b) for two tensors of one shape and type; anything else cannot be chosen on the device."""
    ok = not isinstance(a, SeqValue) and not isinstance(b, SeqValue) and a is not None and b is not None
    if ok:
        ta, tb = ctx.t(a), ctx.t(b)
        ok = ta.shape == tb.shape and ta.dtype == tb.dtype
    if not ok:
        raise ctx.unsupported(
            f"the condition is computed on the device from input data, so plait selects between the two {what}"
            f" with where; that needs tensors of one shape and type, got {_describe(a)} and {_describe(b)}."
            " Make the condition a graph input or a constant, or give both sides the same shape"
        )
    return where(cond, ta, tb)


def _take(v: Any, i: int, axis: int) -> Any:
    """Slice `i` of `v` along `axis` (the axis dropped)."""
    if isinstance(v, np.ndarray):
        return np.take(v, i, axis=axis)
    return v[(slice(None),) * axis + (i,)]


def _stack(ctx: Ctx, items: list[Any], axis: int, info: onnx.ValueInfoProto, what: str) -> Any:
    """The per-iteration values `items` stacked along a new `axis`. With no iterations, the shape comes from the
    body's declared output type, which must then be static."""
    if not items:
        tt = info.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        want = elem_np(tt.elem_type)
        if not tt.HasField("shape") or -1 in dims or want is None:
            raise ctx.unsupported(
                f"{what} has no iterations, and the body does not declare the static shape and type of output"
                f" {info.name!r}, so the empty result's shape is unknown"
            )
        dims.insert(axis % (len(dims) + 1), 0)
        return np.zeros(dims, want)
    for x in items:
        if x is None or isinstance(x, SeqValue):
            raise ctx.unsupported(f"{what}: a scan output must be a tensor, got {_describe(x)}")
    if all(isinstance(x, np.ndarray) for x in items):
        return np.stack(items, axis=axis)
    return stack([ctx.t(x) for x in items], axis=axis)


def _bounded(ctx: Ctx, steps: int, what: str) -> None:
    if steps > MAX_STEPS:
        raise ctx.unsupported(
            f"{what} would unroll into {steps} iterations; plait unrolls at most {MAX_STEPS} (control flow becomes"
            " straight-line device code when the plan is built)"
        )


# ---------------------------------------------------------------- If


def _if(ctx: Ctx, ins: list[Any]) -> tuple[Any, ...]:
    then_g, else_g = _graph(ctx, "then_branch"), _graph(ctx, "else_branch")
    flag = _control(ctx, ins[0], "cond")
    if flag is not None:
        return tuple(ctx.run_graph(then_g if _truth(ctx, flag, "cond") else else_g, []))
    cond = _flag(ctx, ins[0], "cond")
    outs = zip(ctx.run_graph(then_g, []), ctx.run_graph(else_g, []), strict=True)
    return tuple(_select(ctx, cond, a, b, f"branches' output {i}") for i, (a, b) in enumerate(outs))


register("If", _if)


# ---------------------------------------------------------------- Loop


def _loop(ctx: Ctx, ins: list[Any]) -> tuple[Any, ...]:
    body = _graph(ctx, "body")
    n_state = len(ins) - 2
    n_scan = len(body.output) - 1 - n_state
    if n_state < 0 or n_scan < 0:
        raise ctx.error(f"the body has {len(body.output)} outputs for {max(n_state, 0)} loop-carried values")
    trip: int | None = None
    if ins[0] is not None:
        m = _control(ctx, ins[0], "M")
        if m is None:
            raise ctx.unsupported(
                "the trip count M is computed on the device from input data; plait unrolls loops while it builds"
                " the plan, so M must come from constants or small graph inputs"
            )
        trip = int(m.reshape(-1)[0])
    cond: Any = np.array(True) if ins[1] is None else ins[1]
    state = list(ins[2:])
    scans: list[list[Any]] = [[] for _ in range(n_scan)]
    alive: Tensor | None = None  # the condition, once it is computed on the device from input data
    i = 0
    while trip is None or i < trip:
        if alive is None:
            flag = _control(ctx, cond, "cond")
            if flag is None:
                alive = _start_masking(ctx, cond, trip, n_scan)
            elif not _truth(ctx, flag, "cond"):
                break
        _bounded(ctx, i + 1, "the loop")
        outs = ctx.run_graph(body, [np.array(i, np.int64), cond if alive is None else alive, *state])
        new_state = outs[1 : 1 + n_state]
        if alive is None:
            state = new_state
            for j, x in enumerate(outs[1 + n_state :]):
                scans[j].append(x)
            cond = outs[0]
        else:
            state = [
                _select(ctx, alive, n, o, f"values of loop-carried {k}")
                for k, (n, o) in enumerate(zip(new_state, state, strict=True))
            ]
            alive = where(alive, _flag(ctx, outs[0], "cond"), False)
        i += 1
    infos = list(body.output[1 + n_state :])
    return (*state, *(_stack(ctx, s, 0, info, "the loop") for s, info in zip(scans, infos, strict=True)))


def _start_masking(ctx: Ctx, cond: Any, trip: int | None, n_scan: int) -> Tensor:
    """The device flag of a loop whose condition depends on input data: the remaining iterations are unrolled up
    to the trip count, each state update kept only while the flag holds."""
    if trip is None:
        raise ctx.unsupported(
            "the loop's condition is computed on the device from input data and the loop has no trip count M, so"
            " the number of iterations is unbounded when the plan is built; give the Loop a trip count"
        )
    if n_scan:
        raise ctx.unsupported(
            "the loop's condition is computed on the device from input data, so the length of its scan outputs"
            " depends on the data; plait needs shapes when it builds the plan"
        )
    _bounded(ctx, trip, "the loop")
    return _flag(ctx, cond, "cond")


register("Loop", _loop, sequences=True)


# ---------------------------------------------------------------- Scan


def _scan_steps(
    ctx: Ctx, body: onnx.GraphProto, states: list[Any], xs: list[Any], axes: list[int], dirs: list[int]
) -> tuple[list[Any], list[list[Any]]]:
    """Run `body` once per slice of the scan inputs `xs` (along `axes`, reversed where `dirs` is 1): the final
    states and, per scan output, the value of each step in iteration order."""
    axes = [a % len(x.shape) if -len(x.shape) <= a < len(x.shape) else -1 for a, x in zip(axes, xs, strict=True)]
    if -1 in axes:
        raise ctx.error(f"scan_input_axes {axes} out of range for inputs of shapes {[x.shape for x in xs]}")
    lengths = {x.shape[a] for x, a in zip(xs, axes, strict=True)}
    if len(lengths) != 1:
        raise ctx.error(f"scan inputs have different lengths {sorted(lengths)} along their scan axes")
    steps = lengths.pop()
    _bounded(ctx, steps, "the scan")
    scans: list[list[Any]] = [[] for _ in range(len(body.output) - len(states))]
    for t in range(steps):
        sl = [_take(x, steps - 1 - t if d else t, a) for x, a, d in zip(xs, axes, dirs, strict=True)]
        outs = ctx.run_graph(body, [*states, *sl])
        states = outs[: len(states)]
        for j, y in enumerate(outs[len(states) :]):
            scans[j].append(y)
    return states, scans


def _scan(ctx: Ctx, ins: list[Any]) -> tuple[Any, ...]:
    body = _graph(ctx, "body")
    m = int(ctx.attr("num_scan_inputs", 0))
    if ctx.opset < 9:
        return _scan8(ctx, ins, body, m)
    n = len(ins) - m
    if m < 1 or n < 0:
        raise ctx.error(f"num_scan_inputs {m} does not fit {len(ins)} inputs")
    k = len(body.output) - n
    in_axes = list(ctx.attr("scan_input_axes", [0] * m))
    dirs = list(ctx.attr("scan_input_directions", [0] * m))
    out_axes = list(ctx.attr("scan_output_axes", [0] * k))
    out_dirs = list(ctx.attr("scan_output_directions", [0] * k))
    if len(in_axes) != m or len(dirs) != m or len(out_axes) != k or len(out_dirs) != k:
        raise ctx.error(
            f"scan_input_axes/directions need {m} entries and scan_output_axes/directions {k}, got"
            f" {in_axes}, {dirs}, {out_axes}, {out_dirs}"
        )
    states, scans = _scan_steps(ctx, body, list(ins[:n]), list(ins[n:]), in_axes, dirs)
    outs = []
    for steps, axis, d, info in zip(scans, out_axes, out_dirs, body.output[n:], strict=True):
        outs.append(_stack(ctx, steps[::-1] if d else steps, axis, info, "the scan"))
    return (*states, *outs)


def _scan8(ctx: Ctx, ins: list[Any], body: onnx.GraphProto, m: int) -> tuple[Any, ...]:
    """Scan-8: axis 0 of every input is a batch, axis 1 of the scan inputs the sequence; each batch entry is
    scanned on its own and the results are stacked back along the batch axis."""
    rest = ins[1:]
    n = len(rest) - m
    if m < 1 or n < 0:
        raise ctx.error(f"num_scan_inputs {m} does not fit {len(ins)} inputs")
    states, xs = rest[:n], rest[n:]
    batch, steps = xs[0].shape[0], xs[0].shape[1]
    _bounded(ctx, batch * steps, "the scan (batch x sequence)")
    if ins[0] is not None and any(x != steps for x in ctx.ints(ins[0], "sequence_lens")):
        raise ctx.unsupported(f"sequence_lens other than the full length {steps} are not supported")
    dirs = list(ctx.attr("directions", [0] * m))
    if len(dirs) != m:
        raise ctx.error(f"directions {dirs} needs one entry per scan input ({m})")
    per_batch: list[list[Any]] = []
    for b in range(batch):
        st, scans = _scan_steps(
            ctx, body, [_take(s, b, 0) for s in states], [_take(x, b, 0) for x in xs], [0] * m, dirs
        )
        infos = body.output[n:]
        per_batch.append(st + [_stack(ctx, s, 0, info, "the scan") for s, info in zip(scans, infos, strict=True)])
    return tuple(
        _stack(ctx, list(col), 0, info, "the scan")
        for col, info in zip(zip(*per_batch, strict=True), body.output, strict=True)
    )


register("Scan", _scan)


# ---------------------------------------------------------------- sequences


def _seq(ctx: Ctx, v: Any, what: str) -> SeqValue:
    if not isinstance(v, SeqValue):
        raise ctx.error(f"input {what} must be a sequence, got {_describe(v)}")
    return v


def _tensor(ctx: Ctx, v: Any, what: str) -> Any:
    if v is None or isinstance(v, SeqValue):
        raise ctx.error(f"input {what} must be a tensor, got {_describe(v)}")
    return v


def _position(ctx: Ctx, v: Any, n: int, default: int, insert: bool) -> int:
    """Position input `v` (default `default`) as an index into a sequence of `n`, negative counting from the end;
    an insert may also name the end itself."""
    if v is None:
        return default
    p = ctx.ints(v, "position")
    hi = n if insert else n - 1
    if len(p) != 1 or not -n <= p[0] <= hi:
        raise ctx.error(f"position {p} is out of range for a sequence of {n} elements (valid: {-n} to {hi})")
    return p[0] + n if p[0] < 0 else p[0]


def _sequence_construct(ctx: Ctx, ins: list[Any]) -> tuple[SeqValue]:
    return (SeqValue(tuple(_tensor(ctx, x, f"inputs[{i}]") for i, x in enumerate(ins))),)


def _sequence_insert(ctx: Ctx, ins: list[Any]) -> tuple[SeqValue]:
    items = list(_seq(ctx, ins[0], "input_sequence").items)
    pos = _position(ctx, ins[2] if len(ins) > 2 else None, len(items), len(items), insert=True)
    items.insert(pos, _tensor(ctx, ins[1], "tensor"))
    return (SeqValue(tuple(items)),)


def _sequence_erase(ctx: Ctx, ins: list[Any]) -> tuple[SeqValue]:
    items = list(_seq(ctx, ins[0], "input_sequence").items)
    if not items:
        raise ctx.error("cannot erase from an empty sequence")
    del items[_position(ctx, ins[1] if len(ins) > 1 else None, len(items), len(items) - 1, insert=False)]
    return (SeqValue(tuple(items)),)


def _sequence_at(ctx: Ctx, ins: list[Any]) -> tuple[Any]:
    items = _seq(ctx, ins[0], "input_sequence").items
    if ins[1] is None:
        raise ctx.error("input position is required")
    return (items[_position(ctx, ins[1], len(items), 0, insert=False)],)


register("SequenceEmpty", lambda ctx, ins: (SeqValue(()),), sequences=True)
register("SequenceConstruct", _sequence_construct, sequences=True)
register("SequenceInsert", _sequence_insert, sequences=True)
register("SequenceErase", _sequence_erase, sequences=True)
register("SequenceAt", _sequence_at, sequences=True)
register(
    "SequenceLength",
    lambda ctx, ins: (np.array(len(_seq(ctx, ins[0], "input_sequence").items), np.int64),),
    sequences=True,
)


def _split_to_sequence(ctx: Ctx, ins: list[Any]) -> tuple[SeqValue]:
    x = _tensor(ctx, ins[0], "input")
    rank = len(x.shape)
    axis = int(ctx.attr("axis", 0))
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for an input of shape {tuple(x.shape)}")
    axis %= rank
    n = x.shape[axis]
    split = None if len(ins) < 2 or ins[1] is None else ctx.host(ins[1], "split")
    if split is None:
        sizes = [1] * n
    elif split.ndim == 0:
        chunk = int(split)
        if chunk <= 0:
            raise ctx.error(f"split {chunk} must be positive")
        sizes = [min(chunk, n - s) for s in range(0, n, chunk)]
    else:
        sizes = [int(s) for s in split]
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise ctx.error(f"split sizes {sizes} do not add up to {n} (axis {axis} of shape {tuple(x.shape)})")
    if isinstance(x, np.ndarray):
        parts = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    else:
        parts = x.split(sizes, axis)
    if split is None and not ctx.attr("keepdims", 1):
        parts = [_take(p, 0, axis) for p in parts]
    return (SeqValue(tuple(parts)),)


def _concat_from_sequence(ctx: Ctx, ins: list[Any]) -> Any:
    items = list(_seq(ctx, ins[0], "input_sequence").items)
    if not items:
        raise ctx.error("the sequence is empty; ConcatFromSequence needs at least one tensor")
    if ctx.attr("axis") is None:
        raise ctx.error("attribute axis is required")
    axis, new_axis = int(ctx.attr("axis")), bool(ctx.attr("new_axis", 0))
    rank = len(items[0].shape) + new_axis
    if not -rank <= axis < rank:
        raise ctx.error(f"axis {axis} is out of range for elements of shape {tuple(items[0].shape)}")
    if all(isinstance(x, np.ndarray) for x in items):
        return np.stack(items, axis) if new_axis else np.concatenate(items, axis)
    ts = [ctx.t(x) for x in items]
    return stack(ts, axis) if new_axis else cat(ts, axis % rank)


register("SplitToSequence", _split_to_sequence)
register("ConcatFromSequence", _concat_from_sequence, sequences=True)


def _sequence_map(ctx: Ctx, ins: list[Any]) -> tuple[SeqValue, ...]:
    body = _graph(ctx, "body")
    n = len(_seq(ctx, ins[0], "input_sequence").items)
    for i, x in enumerate(ins):
        if isinstance(x, SeqValue) and len(x.items) != n:
            raise ctx.error(f"input {i} is a sequence of {len(x.items)}, the first of {n}; they must match")
    _bounded(ctx, n, "SequenceMap")
    results: list[list[Any]] = [[] for _ in body.output]
    for i in range(n):
        outs = ctx.run_graph(body, [x.items[i] if isinstance(x, SeqValue) else x for x in ins])
        for r, y in zip(results, outs, strict=True):
            r.append(y)
    return tuple(SeqValue(tuple(r)) for r in results)


register("SequenceMap", _sequence_map, sequences=True)


# ---------------------------------------------------------------- optionals


def _optional_get_element(ctx: Ctx, ins: list[Any]) -> tuple[Any]:
    if ins[0] is None:
        raise ctx.error("the optional is empty (check it with OptionalHasElement first)")
    return (ins[0],)


register("Optional", lambda ctx, ins: (ins[0] if ins else None,), sequences=True)
register("OptionalHasElement", lambda ctx, ins: (np.array(bool(ins) and ins[0] is not None),), sequences=True)
register("OptionalGetElement", _optional_get_element, sequences=True)
