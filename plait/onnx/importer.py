"""ONNX graph -> plait Tensor ops. Values are plait Tensors (device) or NumPy arrays (host constants, folded).

The importer walks the nodes in order, calling the op table. Graph inputs become `input` placeholder nodes of a
concrete shape; initializers stay NumPy until a device op needs them, then each is uploaded once per session.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from plait import dtypes
from plait.dtypes import DType
from plait.frontends.native.tensor import Tensor
from plait.graph.node import Node, toposort
from plait.onnx.errors import NeedValue, OnnxModelError, OnnxUnsupportedError
from plait.onnx.formats import STORAGE, ValueTypes, elem_of
from plait.onnx.loader import DEFAULT_DOMAINS, LoadedModel, elem_name, to_numpy
from plait.onnx.ops import TABLE, load_all

Value = Tensor | np.ndarray

# operators of ONNX's preview domain that the op table implements (under their plain names)
PREVIEW_OPS = frozenset({("ai.onnx.preview", "FlexAttention")})


@dataclass(frozen=True)
class SeqValue:
    """An ONNX sequence while importing: its elements (Tensors or host arrays) in order. It is immutable, as ONNX
    values are: SequenceInsert makes a new one. (An empty optional is None; a full one is its element.)"""

    items: tuple[Any, ...]


# NumPy dtype -> the plait dtype that computes it. Narrower integers widen; float64 is computed in float32.
_COMPUTE: dict[np.dtype, DType] = {
    np.dtype(np.float32): dtypes.float32,
    np.dtype(np.float64): dtypes.float32,
    np.dtype(np.float16): dtypes.float16,
    np.dtype(np.int64): dtypes.int64,
    np.dtype(np.int32): dtypes.int32,
    np.dtype(np.int16): dtypes.int32,
    np.dtype(np.int8): dtypes.int32,
    np.dtype(np.uint8): dtypes.int32,
    np.dtype(np.uint16): dtypes.int32,
    np.dtype(np.uint32): dtypes.int64,
    np.dtype(np.uint64): dtypes.int64,
    np.dtype(np.bool_): dtypes.bool_,
    **STORAGE,  # bfloat16, float8, float4, int4/int2: stored in float32 / int32 (plait/onnx/formats.py)
}


def compute_dtype(npd: Any, what: str) -> DType:
    """The plait dtype that stands for NumPy dtype `npd`, or an OnnxUnsupportedError naming `what`."""
    d = _COMPUTE.get(np.dtype(npd)) if npd is not None else None
    if d is None:
        raise OnnxUnsupportedError(
            f"{what}: element type {npd} is not supported (plait computes float32, float16, int32, int64 and bool;"
            " float64 and narrow integers are widened)"
        )
    return d


def attrs_of(node: onnx.NodeProto, base_dir: Any) -> dict[str, Any]:
    """A node's attributes as Python values; subgraphs (If branches, Loop/Scan bodies) stay GraphProtos, which
    `Importer.run_graph` imports when the op asks."""
    out: dict[str, Any] = {}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out[a.name] = a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            out[a.name] = list(a.graphs)
        elif a.type == onnx.AttributeProto.TENSOR:
            out[a.name] = to_numpy(a.t, base_dir, f"node {node.name!r} attribute {a.name}")
        elif a.ref_attr_name:
            raise OnnxUnsupportedError(f"node {node.name!r}: attribute references (functions) are not supported")
        else:
            v = helper.get_attribute_value(a)
            out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


class Ctx:
    """What an op implementation sees: the node's attributes, the opset, and converters between host and device."""

    def __init__(
        self, imp: Importer, node: onnx.NodeProto, attrs: dict[str, Any], env: MutableMapping[str, Any] | None = None
    ):
        self.imp = imp
        self.node = node
        self.attrs = attrs
        self.env: MutableMapping[str, Any] = {} if env is None else env  # the scope a subgraph of this node sees
        self.opset = imp.opset
        self.device = imp.device
        self.label = f"node {node.name!r} ({node.op_type})" if node.name else f"{node.op_type} node"

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def error(self, msg: str) -> OnnxModelError:
        return OnnxModelError(f"{self.label}: {msg}")

    def unsupported(self, msg: str) -> OnnxUnsupportedError:
        return OnnxUnsupportedError(f"{self.label}: {msg}")

    def host(self, v: Value | None, what: str) -> np.ndarray:
        """The value of `v` at compile time (shapes, axes, pads...). A device tensor that comes from graph inputs
        makes the session specialise on those inputs' values; anything else computed is an error."""
        if v is None:
            raise self.error(f"input {what} is required")
        if isinstance(v, np.ndarray):
            return v
        if v.node.op == "buffer":
            return v.numpy()
        names = {self.imp.input_names[n.uid] for n in toposort([v.node]) if n.uid in self.imp.input_names}
        if not names:
            return v.numpy()  # a function of constants only: compute it now
        raise NeedValue(names, self.label)

    def t(self, v: Value) -> Tensor:
        """`v` as a device Tensor (host arrays are uploaded once and cached)."""
        if isinstance(v, Tensor):
            return v
        return self.imp.upload(v, self.label)

    def elem_type(self, i: int, v: Value) -> int:
        """The ONNX element type (TensorProto.FLOAT...) of input `i`, whose value is `v`. Types plait stores in a
        wider dtype (float8, int4...) are known from the model's declarations and shape inference, not from `v`."""
        if isinstance(v, np.ndarray):
            return elem_of(v.dtype)
        known = self.imp.elem_types.get(self.node.input[i])
        return known if known is not None else elem_of(v.dtype.np)

    def ints(self, v: Value | None, what: str) -> list[int]:
        return [int(x) for x in self.host(v, what).reshape(-1)]

    def run_graph(self, graph: onnx.GraphProto, inputs: list[Any]) -> list[Any]:
        """Import subgraph `graph` (a branch or loop body of this node) with `inputs` bound to its inputs."""
        return self.imp.run_graph(graph, self.env, inputs, self.label)


class Importer:
    """Builds plait Tensors for a model's outputs from concrete input shapes (and, where ops need them, values)."""

    def __init__(self, loaded: LoadedModel, device: str):
        self.model = loaded.model
        self.graph = loaded.model.graph
        self.opset = loaded.opset
        self.base_dir = loaded.base_dir
        self.device = device
        self.initializers = {
            t.name: to_numpy(t, self.base_dir, f"initializer {t.name!r}") for t in self.graph.initializer
        }
        self._uploads: dict[int, tuple[np.ndarray, Tensor]] = {}
        self._subgraph_inits: dict[int, tuple[onnx.GraphProto, dict[str, np.ndarray]]] = {}
        self.elem_types = ValueTypes(self.model)
        self.input_names: dict[int, str] = {}
        load_all()
        self._check_ops()

    def _check_ops(self, graph: onnx.GraphProto | None = None) -> None:
        for node in (self.graph if graph is None else graph).node:
            for a in node.attribute:
                for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                    self._check_ops(sub)
            if node.domain not in DEFAULT_DOMAINS and (node.domain, node.op_type) not in PREVIEW_OPS:
                raise OnnxUnsupportedError(
                    f"node {node.name!r}: operator {node.domain}.{node.op_type} is from a domain plait does not support"
                    " (only the default ONNX domain)"
                )
            if node.op_type not in TABLE:
                raise OnnxUnsupportedError(
                    f"node {node.name!r}: operator {node.op_type} is not supported by plait's ONNX importer"
                    " (see docs/onnx.md for the supported list)"
                )

    def upload(self, arr: np.ndarray, what: str) -> Tensor:
        hit = self._uploads.get(id(arr))
        if hit is not None and hit[0] is arr:
            return hit[1]
        dt = compute_dtype(arr.dtype, what)
        t = Tensor.from_numpy(np.asarray(arr).astype(dt.np, copy=False), dtype=dt, device=self.device)
        self._uploads[id(arr)] = (arr, t)
        return t

    def build(
        self,
        shapes: dict[str, tuple[tuple[int, ...], DType]],
        values: dict[str, np.ndarray],
        sequences: dict[str, list[str] | None] | None = None,
    ) -> tuple[list[Node], list[Any]]:
        """Placeholders for the inputs in `shapes` and the graph's outputs as Tensors or host arrays. Inputs in
        `values` are folded in as constants instead. `sequences` names the sequence (and optional) graph inputs:
        each is a list of the names in `shapes` that hold its elements, or None for an empty optional."""
        env: dict[str, Any] = dict(self.initializers)
        placeholders: list[Node] = []
        self.input_names = {}
        for name, (shape, dt) in shapes.items():
            if name in values:
                env[name] = values[name]
                continue
            node = Node("input", (), None, shape, dt, self.device)
            placeholders.append(node)
            self.input_names[node.uid] = name
            env[name] = Tensor(node)
        for name, parts in (sequences or {}).items():
            env[name] = None if parts is None else SeqValue(tuple(env[p] for p in parts))
        for node in self.graph.node:
            self._run_node(node, env)
        outs = []
        for o in self.graph.output:
            if o.name not in env:
                raise OnnxModelError(f"graph output {o.name!r} is produced by no node")
            outs.append(env[o.name])
        return placeholders, outs

    def run_graph(
        self, graph: onnx.GraphProto, outer: MutableMapping[str, Any], inputs: list[Any], owner: str
    ) -> list[Any]:
        """The outputs of subgraph `graph` with `inputs` bound to its inputs, in a scope that sees `outer` (the
        enclosing graph's values); what the subgraph defines stays in its own scope."""
        if len(inputs) != len(graph.input):
            raise OnnxModelError(
                f"{owner}: subgraph {graph.name!r} takes {len(graph.input)} inputs, the node gives {len(inputs)}"
            )
        hit = self._subgraph_inits.get(id(graph))
        if hit is None or hit[0] is not graph:  # read once, so each loop iteration reuses the same uploads
            inits = {
                t.name: to_numpy(t, self.base_dir, f"{owner} subgraph initializer {t.name!r}")
                for t in graph.initializer
            }
            hit = self._subgraph_inits[id(graph)] = (graph, inits)
        scope: dict[str, Any] = dict(hit[1])
        scope.update({i.name: v for i, v in zip(graph.input, inputs, strict=True)})
        env: ChainMap[str, Any] = ChainMap(scope, outer)
        for node in graph.node:
            self._run_node(node, env)
        missing = [o.name for o in graph.output if o.name not in env]
        if missing:
            raise OnnxModelError(f"{owner}: subgraph {graph.name!r} outputs {missing} are produced by no node")
        return [env[o.name] for o in graph.output]

    def _run_node(self, node: onnx.NodeProto, env: MutableMapping[str, Any]) -> None:
        ctx = Ctx(self, node, attrs_of(node, self.base_dir), env)
        ins: list[Any] = []
        for name in node.input:
            if not name:
                ins.append(None)
            elif name in env:
                ins.append(env[name])  # None here is an empty optional: to an op, the same as an absent input
            else:
                raise ctx.error(f"input {name!r} is produced by no earlier node and is not a graph input")
        op = TABLE[node.op_type]
        if not op.sequences:
            for name, x in zip(node.input, ins, strict=True):
                if isinstance(x, SeqValue) or (name and x is None):
                    what = "a sequence" if x is not None else "an empty optional"
                    raise ctx.unsupported(f"input {name!r} is {what}, but this operator takes tensors")
        if op.fold is not None and all(x is None or isinstance(x, np.ndarray) for x in ins):
            result = op.fold(ctx, ins)
        else:
            result = op.fn(ctx, ins)
        outs = list(result) if isinstance(result, (list, tuple)) else [result]
        for name, val in zip(node.output, outs, strict=False):
            if name:
                # sequences and empty optionals (None) stay as they are; the rest is a tensor or an array
                env[name] = val if val is None or isinstance(val, (Tensor, SeqValue)) else np.asarray(val)


def type_label(elem_type: int) -> str:
    return f"tensor({_ORT_TYPE.get(int(elem_type), elem_name(elem_type))})"


_ORT_TYPE: dict[int, str] = {
    onnx.TensorProto.FLOAT: "float",
    onnx.TensorProto.DOUBLE: "double",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.UINT32: "uint32",
    onnx.TensorProto.UINT64: "uint64",
    onnx.TensorProto.BOOL: "bool",
    onnx.TensorProto.STRING: "string",
}
