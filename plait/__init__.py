"""plait: a portable deep-learning compiler and runtime (generated C on CPUs, OpenCL C on any GPU).

>>> import plait
>>> a = plait.tensor([[1.0, 2.0], [3.0, 4.0]], device="cpu")
>>> (a @ a).numpy().tolist()
[[7.0, 10.0], [15.0, 22.0]]
"""

from plait import dtypes, models, nn, optim
from plait.dtypes import bool_, float16, float32, int32, int64
from plait.errors import (
    CompileError,
    DeviceError,
    DTypeError,
    PlaitError,
    ShapeError,
    TileError,
    UnsupportedError,
)
from plait.frontends.native.jit import jit
from plait.frontends.native.tensor import Tensor, cat, concatenate, matmul, maximum, minimum, stack, tensor, where
from plait.graph.autodiff import no_grad
from plait.runtime import default_device

__version__ = "0.1.0"


def explain(model: object, *example_inputs: object, **kwargs: object) -> object:
    """Which ops of a PyTorch model run in plait under torch.compile(backend="plait"), and how many kernels."""
    from plait.frontends.torch import explain as _explain

    return _explain(model, *example_inputs, **kwargs)  # type: ignore[arg-type]


def __getattr__(name: str) -> object:
    """plait.tile and plait.onnx load on first use (plait.onnx needs the onnx package)."""
    if name in ("tile", "onnx"):
        import importlib

        return importlib.import_module(f"plait.{name}")
    raise AttributeError(f"module 'plait' has no attribute {name!r}")


def devices() -> list[dict[str, object]]:
    """Every device plait sees: name, kind, usable, and either its properties or why it cannot be used."""
    from plait.runtime.discovery import list_devices

    return list_devices()


__all__ = [
    "CompileError",
    "DTypeError",
    "DeviceError",
    "PlaitError",
    "ShapeError",
    "Tensor",
    "TileError",
    "UnsupportedError",
    "bool_",
    "cat",
    "models",
    "nn",
    "optim",
    "concatenate",
    "default_device",
    "devices",
    "dtypes",
    "explain",
    "float16",
    "float32",
    "int32",
    "int64",
    "jit",
    "matmul",
    "maximum",
    "minimum",
    "no_grad",
    "stack",
    "tensor",
    "where",
]
