"""plait's ONNX frontend: run .onnx models with ONNX Runtime's API on any plait device.

>>> import plait.onnx
>>> sess = plait.onnx.InferenceSession("model.onnx", device="cpu")  # doctest: +SKIP
>>> outputs = sess.run(None, {"input": x})  # doctest: +SKIP

`plait.onnx.backend` implements `onnx.backend.base.Backend` (the ONNX conformance suite runs against it).
"""

from plait.onnx.errors import OnnxInputError, OnnxModelError, OnnxUnsupportedError
from plait.onnx.session import InferenceSession, NodeArg

__all__ = ["InferenceSession", "NodeArg", "OnnxInputError", "OnnxModelError", "OnnxUnsupportedError"]
