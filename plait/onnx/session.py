"""`InferenceSession`: ONNX Runtime's surface over compiled plait plans.

One Plan per input-shape signature (symbolic dims recompile per concrete shape; plans are cached), so `run`
only validates the feed, copies inputs in, replays the kernels and copies outputs out.

>>> import numpy as np, onnx, plait.onnx
>>> from onnx import helper, TensorProto as T
>>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
...     [helper.make_tensor_value_info("x", T.FLOAT, ["n", 2])], [helper.make_tensor_value_info("y", T.FLOAT, ["n", 2])])
>>> sess = plait.onnx.InferenceSession(helper.make_model(g).SerializeToString(), device="cpu")
>>> sess.run(None, {"x": np.array([[-1.0, 2.0]], np.float32)})[0].tolist()
[[0.0, 2.0]]
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from plait.frontends.native.tensor import Tensor
from plait.graph.node import Node
from plait.onnx.errors import NeedValue, OnnxInputError
from plait.onnx.importer import Importer, SeqValue, compute_dtype, type_label
from plait.onnx.loader import elem_np, load
from plait.runtime import canonical, default_device
from plait.schedule.plan import Plan


@dataclass(frozen=True)
class NodeArg:
    """An input or output description, as ONNX Runtime's NodeArg: name, shape (ints, or str for symbolic dims,
    None for unknown) and type ('tensor(float)')."""

    name: str
    shape: list[int | str | None]
    type: str


def _arg(v: onnx.ValueInfoProto) -> NodeArg:
    tt = v.type.tensor_type
    shape: list[int | str | None] = []
    for d in tt.shape.dim:
        shape.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    return NodeArg(v.name, shape, _type_text(v.type))


def _type_text(tp: onnx.TypeProto) -> str:
    """ONNX Runtime's spelling of a value type: 'tensor(float)', 'seq(tensor(float))', 'optional(...)'."""
    if tp.HasField("sequence_type"):
        return f"seq({_type_text(tp.sequence_type.elem_type)})"
    if tp.HasField("optional_type"):
        return f"optional({_type_text(tp.optional_type.elem_type)})"
    return type_label(tp.tensor_type.elem_type)


@dataclass(frozen=True)
class _Repeat:
    """A call `run` can repeat with no checks beyond the feed's signature (InferenceSession._repeatable): the output
    names asked for (None: all), the feed's (name, shape, dtype) in order, the plan, the feed positions of its
    inputs and the plan results handed out."""

    names: tuple[str, ...] | None
    sig: tuple[tuple[str, tuple[int, ...], np.dtype[Any]], ...]
    plan: Plan
    order: list[int]
    pick: list[int]


@dataclass
class _Compiled:
    plan: Plan | None
    placeholders: list[str]
    outputs: list[Any]  # Tensors, host arrays, SeqValues or None (an empty optional)
    input_of: dict[int, str]


class InferenceSession:
    """Run an ONNX model with plait: `InferenceSession(path_or_bytes, device="cpu").run(None, {"x": array})`."""

    def __init__(
        self,
        path_or_bytes: str | os.PathLike[str] | bytes | onnx.ModelProto,
        device: str | None = None,
        **_ort_options: Any,
    ):
        self._loaded = load(path_or_bytes)
        self.device = canonical(device) if device else default_device()
        self._importer = Importer(self._loaded, self.device)
        graph = self._loaded.model.graph
        inits = set(self._importer.initializers)
        self._inputs = [v for v in graph.input if v.name not in inits]
        self._outputs = list(graph.output)
        self._value_inputs: set[str] = set()
        self._plans: dict[Any, _Compiled] = {}
        self._output_index = {o.name: i for i, o in enumerate(self._outputs)}
        self._repeat: _Repeat | None = None  # the last call, where run can repeat it directly (_repeatable)

    def get_inputs(self) -> list[NodeArg]:
        return [_arg(v) for v in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_arg(v) for v in self._outputs]

    def get_providers(self) -> list[str]:
        return [f"plait:{self.device}"]

    def _check_feed(self, feed: dict[str, Any]) -> dict[str, Any]:
        known = {v.name for v in self._inputs}
        for name in feed:
            if name not in known:
                raise OnnxInputError(f"input {name!r} is not an input of this model (inputs: {sorted(known)})")
        out: dict[str, Any] = {}
        for v in self._inputs:
            if v.name not in feed:
                raise OnnxInputError(f"input {v.name!r} is missing from the feed (inputs: {sorted(known)})")
            out[v.name] = self._check_value(v, v.type, feed[v.name])
        return out

    def _check_value(self, v: onnx.ValueInfoProto, tp: onnx.TypeProto, value: Any) -> Any:
        """`value` checked against type `tp` of input `v`: an array, a list of them (a sequence) or None (an empty
        optional)."""
        if tp.HasField("optional_type"):
            return None if value is None else self._check_value(v, tp.optional_type.elem_type, value)
        if tp.HasField("sequence_type"):
            if not isinstance(value, (list, tuple)):
                raise OnnxInputError(
                    f"input {v.name!r} is a sequence ({_type_text(tp)}): feed a list of arrays, not"
                    f" {type(value).__name__}"
                )
            return [self._check_value(v, tp.sequence_type.elem_type, x) for x in value]
        arr = np.asarray(value)
        tt = tp.tensor_type
        want = elem_np(tt.elem_type)
        if arr.dtype == object and want is not None and want.kind in "biuf":
            arr = arr.astype(want)  # Python scalars in an object array: take the declared type
        if want is not None and arr.dtype != want:
            raise OnnxInputError(
                f"input {v.name!r} has dtype {arr.dtype} but the model expects {type_label(tt.elem_type)}"
                f" ({want}); cast it with .astype(np.{want})"
            )
        dims = list(tt.shape.dim)
        expected = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]
        if tt.HasField("shape"):
            if len(dims) != arr.ndim:
                raise OnnxInputError(
                    f"input {v.name!r} has shape {arr.shape} (rank {arr.ndim}) but the model expects rank"
                    f" {len(dims)}: {expected}"
                )
            for i, d in enumerate(dims):
                if d.HasField("dim_value") and d.dim_value != arr.shape[i]:
                    raise OnnxInputError(
                        f"input {v.name!r} has shape {arr.shape} but the model expects {expected}"
                        f" (axis {i} must be {d.dim_value})"
                    )
        return arr

    def _compile(self, feed: dict[str, np.ndarray], sequences: dict[str, list[str] | None]) -> _Compiled:
        """The plan for flat `feed` (sequence inputs arrive as their elements, laid out by `sequences`)."""
        layout = tuple(sorted((n, -1 if p is None else len(p)) for n, p in sequences.items()))
        while True:
            values = {n: feed[n] for n in self._value_inputs if n in feed}  # a shorter sequence lacks some
            key = (
                tuple((n, a.shape, a.dtype.str) for n, a in feed.items())
                + layout
                + tuple((n, a.tobytes()) for n, a in sorted(values.items()))
            )
            hit = self._plans.get(key)
            if hit is not None:
                return hit
            shapes = {n: (a.shape, compute_dtype(a.dtype, f"input {n!r}")) for n, a in feed.items()}
            try:
                placeholders, outs = self._importer.build(shapes, values, sequences)
            except NeedValue as e:
                if e.names <= self._value_inputs:
                    raise
                self._value_inputs |= e.names
                continue
            input_of = dict(self._importer.input_names)
            nodes = [o.node for o in _tensors(outs) if not o.node.realized]
            plan = Plan(_unique(nodes), placeholders) if nodes else None
            self._plans[key] = _Compiled(plan, [input_of[n.uid] for n in placeholders], outs, input_of)
            return self._plans[key]

    def plan_for(self, input_feed: dict[str, Any]) -> Plan | None:
        """The compiled plan that `run` replays for feeds like `input_feed` (built now if it is not yet), or None
        when every output is known at import time: for per-kernel reports (plait.schedule.profile) and tests."""
        feed, sequences = _flatten(self._check_feed(input_feed))
        return self._compile(feed, sequences).plan

    def run(self, output_names: list[str] | None, input_feed: dict[str, Any], run_options: Any = None) -> list[Any]:
        """Outputs `output_names` (None: all of them) for `input_feed` {input name: array}. Sequence inputs and
        outputs are lists of arrays; an empty optional is None."""
        names = None if output_names is None else tuple(output_names)
        fast = self._repeat
        if fast is not None and fast.names == names and type(input_feed) is dict and len(input_feed) == len(fast.sig):
            arrays = []
            for name, shape, dtype in fast.sig:
                a = input_feed.get(name)
                if type(a) is not np.ndarray or a.shape != shape or a.dtype != dtype:
                    break
                arrays.append(a)
            else:
                outs = fast.plan(*(arrays[i] for i in fast.order))
                return [outs[j] for j in fast.pick]
        feed, sequences = _flatten(self._check_feed(input_feed))
        c = self._compile(feed, sequences)
        results: dict[int, np.ndarray] = {}
        if c.plan is not None:
            arrays = c.plan(*(feed[n] for n in c.placeholders))
            results = {n.uid: a for n, a in zip(c.plan.outputs, arrays, strict=True)}
        by_name = self._output_index
        wanted = list(by_name) if names is None else list(names)
        out = []
        handed: set[int] = set()  # the plan's fresh result arrays already returned once (a second use is a copy)
        for name in wanted:
            if name not in by_name:
                raise OnnxInputError(f"output {name!r} is not an output of this model (outputs: {list(by_name)})")
            i = by_name[name]
            out.append(self._finish(c, c.outputs[i], results, feed, self._outputs[i].type, handed))
        self._repeat = self._repeatable(c, feed, sequences, names, wanted, out, results)
        return out

    def _repeatable(
        self,
        c: _Compiled,
        feed: dict[str, np.ndarray],
        sequences: dict[str, list[str] | None],
        names: tuple[str, ...] | None,
        wanted: list[str],
        out: list[Any],
        results: dict[int, np.ndarray],
    ) -> _Repeat | None:
        """How `run` repeats this call for a feed of the same names, shapes and dtypes (plain arrays) and the same
        output names: the plan's call and its result arrays handed over as they are, with no other Python. Only
        where that is exactly what this call did: one plan, no sequence inputs, no plan that depends on input
        values, every wanted output a distinct fresh result of the plan (not a constant, an input or a copy)."""
        if c.plan is None or sequences or self._value_inputs or set(feed) != {v.name for v in self._inputs}:
            return None
        position = {id(a): j for j, a in enumerate(results.values())}
        pick = [position.get(id(a), -1) for a in out]
        if -1 in pick or len(set(pick)) != len(pick) or len(pick) != len(wanted):
            return None
        sig = tuple((n, a.shape, a.dtype) for n, a in feed.items())
        slot = {n: i for i, (n, _, _) in enumerate(sig)}
        return _Repeat(names, sig, c.plan, [slot[n] for n in c.placeholders], pick)

    @classmethod
    def _finish(
        cls,
        c: _Compiled,
        v: Any,
        results: dict[int, np.ndarray],
        feed: dict[str, np.ndarray],
        tp: onnx.TypeProto,
        handed: set[int],
    ) -> Any:
        """Output value `v` as the caller's own array (or list of them) of type `tp`: the plan's result arrays are
        fresh, so each is handed over as it is the first time (a large output is not copied twice); inputs passed
        through, constants and repeats are copies."""
        if tp.HasField("optional_type"):
            tp = tp.optional_type.elem_type
        if v is None:
            return None
        if isinstance(v, SeqValue):
            elem = tp.sequence_type.elem_type if tp.HasField("sequence_type") else tp
            return [cls._finish(c, x, results, feed, elem, handed) for x in v.items]
        fresh = False
        if isinstance(v, np.ndarray):
            arr = v
        elif v.node.uid in results:
            arr, fresh = results[v.node.uid], True
        elif v.node.op == "input":
            arr = feed[c.input_of[v.node.uid]]
        else:
            arr = v.numpy()
        want = elem_np(tp.tensor_type.elem_type)
        dtype = want if want is not None else arr.dtype
        if fresh and arr.dtype == dtype and id(arr) not in handed:
            handed.add(id(arr))
            return arr
        return np.array(arr, dtype=dtype, copy=True)


def _flatten(feed: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, list[str] | None]]:
    """Arrays by name, with each sequence input's elements under names of their own ('x[0]', 'x[1]'...), and
    the layout of the sequence inputs (their element names; None for an empty optional)."""
    flat: dict[str, np.ndarray] = {}
    sequences: dict[str, list[str] | None] = {}
    for name, v in feed.items():
        if v is None:
            sequences[name] = None
        elif isinstance(v, list):
            parts = [f"{name}[{i}]" for i in range(len(v))]
            sequences[name] = parts
            flat.update(zip(parts, v, strict=True))
        else:
            flat[name] = v
    return flat, sequences


def _tensors(values: list[Any]) -> list[Tensor]:
    """The device tensors among graph outputs, sequences' elements included."""
    out: list[Tensor] = []
    for v in values:
        if isinstance(v, SeqValue):
            out += _tensors(list(v.items))
        elif isinstance(v, Tensor):
            out.append(v)
    return out


def _unique(nodes: list[Node]) -> list[Node]:
    seen: set[int] = set()
    out = []
    for n in nodes:
        if n.uid not in seen:
            seen.add(n.uid)
            out.append(n)
    return out
