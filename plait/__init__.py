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
    TraceError,
    UnsupportedError,
)
from plait.frontends.native.jit import compile_step, jit
from plait.frontends.native.tensor import Tensor, cat, concatenate, matmul, maximum, minimum, stack, tensor, where
from plait.graph.autodiff import no_grad
from plait.runtime import default_device

__version__ = "0.1.0"


def explain(model: object, *example_inputs: object, **kwargs: object) -> object:
    """What plait makes of a model.

    A PyTorch module or function (torch tensors as inputs): which ops run in plait under
    torch.compile(backend="plait") and how many kernels; `kernels=True` adds the per-kernel report (time, GFLOP/s,
    GB/s, % of the device's measured peaks). A plait.jit function, a function of plait Tensors (arrays as inputs) or
    a plait.onnx.InferenceSession (a feed dict as input): the per-kernel report of its compiled plan. `reps` sets
    the timed replays (median per kernel, default 10); see docs/bench.md.
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and (
        isinstance(model, torch.nn.Module) or any(isinstance(x, torch.Tensor) for x in example_inputs)
    ):
        from plait.frontends.torch import explain as _explain

        return _explain(model, *example_inputs, **kwargs)  # type: ignore[arg-type]
    from plait.frontends.native.explaining import kernel_report

    kwargs.pop("kernels", None)  # a plait callable's explanation is its kernel report
    if kwargs.pop("training", False):
        raise PlaitError("plait.explain(..., training=True) is for PyTorch models; a plait function is inference")
    return kernel_report(model, *example_inputs, **kwargs)  # type: ignore[arg-type]


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
    "TraceError",
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
    "compile_step",
    "jit",
    "matmul",
    "maximum",
    "minimum",
    "no_grad",
    "stack",
    "tensor",
    "where",
]
