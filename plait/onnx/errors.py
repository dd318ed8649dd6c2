"""Errors of the ONNX frontend; each names the node or input at fault and what to do about it."""

from __future__ import annotations

from plait.errors import PlaitError, UnsupportedError


class OnnxModelError(PlaitError, ValueError):
    """The model file itself is unusable: truncated, malformed, or pointing outside its folder."""


class OnnxInputError(PlaitError, ValueError):
    """A feed that does not match the model: an unknown or missing input name, a wrong shape or dtype."""


class OnnxUnsupportedError(UnsupportedError):
    """An operator, opset, attribute or element type that plait's ONNX importer does not implement."""


class NeedValue(Exception):
    """Internal: an op needs the value (not just the shape) of graph inputs `names` at compile time, e.g. the
    `shape` input of Reshape. The session then specialises its plan on those inputs' contents."""

    def __init__(self, names: set[str], node: str):
        super().__init__(f"{node} needs the values of {sorted(names)}")
        self.names = names
        self.node = node
