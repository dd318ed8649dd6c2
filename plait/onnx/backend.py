"""`onnx.backend.base.Backend` over plait: `plait.onnx.backend.prepare(model).run(inputs)`.

The module itself is a backend (ONNX's convention: module-level prepare/run_model/run_node/supports_device) that
runs on the device named by PLAIT_DEVICE or plait's default; `backend_for("opencl:0")` gives a Backend class bound
to one plait device, which is how the conformance suite runs on cpu and PoCL side by side.

>>> import numpy as np, onnx.helper as h, plait.onnx.backend as backend
>>> node = h.make_node("Add", ["a", "b"], ["c"])
>>> backend.run_node(node, [np.ones(2, np.float32), np.ones(2, np.float32)])[0].tolist()
[2.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from plait.onnx.errors import OnnxInputError
from plait.onnx.loader import MAX_OPSET
from plait.onnx.session import InferenceSession


class PlaitRep(BackendRep):
    """A prepared model: `run(inputs)` takes a list (in graph-input order) or a dict and returns a list of arrays."""

    def __init__(self, session: InferenceSession):
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(arrays) != len(names):
                raise OnnxInputError(f"the model takes {len(names)} inputs {names}, got {len(arrays)} arrays")
            feed = dict(zip(names, arrays, strict=True))
        return tuple(self.session.run(None, feed))


class PlaitBackend(Backend):
    """Runs models on `plait_device` (None: PLAIT_DEVICE or plait's default device). ONNX's own device string
    ('CPU', 'CUDA') only says where inputs live; plait copies them to its device, so it accepts 'CPU' only."""

    plait_device: str | None = None

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> PlaitRep:
        return PlaitRep(InferenceSession(model, device=cls.plait_device))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on arrays (wrapped into a one-node model with the inputs' dtypes and shapes)."""
        arrays = [np.asarray(a) for a in inputs]
        names = [n for n in node.input if n]
        graph_inputs = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays, strict=True)
        ]
        graph_outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = helper.make_graph([node], "run_node", graph_inputs, graph_outputs)
        opset = int(kwargs.get("opset_version", MAX_OPSET))
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model = onnx.shape_inference.infer_shapes(model)
        return cls.run_model(model, arrays, device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"


def backend_for(device: str | None) -> type[PlaitBackend]:
    """A Backend class that runs every model on plait device `device`."""
    return type(f"PlaitBackend_{(device or 'default').replace(':', '_')}", (PlaitBackend,), {"plait_device": device})


prepare = PlaitBackend.prepare
run_model = PlaitBackend.run_model
run_node = PlaitBackend.run_node
supports_device = PlaitBackend.supports_device
