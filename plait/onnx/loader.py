"""Reading an ONNX model safely: parse the protobuf, check opsets, and turn tensors (inline or external) into
NumPy arrays. Only tensor bytes are read from the file; nothing in it is executed, unpickled or evaluated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from plait.onnx.errors import OnnxModelError, OnnxUnsupportedError

MIN_OPSET = 7  # 11 and newer are the supported range; 7-10 run where the conformance suite says they do
MAX_OPSET = onnx.defs.onnx_opset_version()
DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    opset: int
    base_dir: Path | None
    name: str


def load(source: str | os.PathLike[str] | bytes | onnx.ModelProto) -> LoadedModel:
    """Parse `source` (a path, the serialized bytes, or a ModelProto) and check that plait can run it."""
    base_dir: Path | None = None
    name = "<bytes>"
    if isinstance(source, onnx.ModelProto):
        model, name = source, "<ModelProto>"
    else:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
        else:
            path = Path(source)
            name = str(path)
            if not path.is_file():
                raise OnnxModelError(f"ONNX model {name!r} does not exist or is not a file")
            data = path.read_bytes()
            base_dir = path.resolve().parent
        model = _parse(data, name)
    external = [t for t in model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    for t in external:
        _external_bytes(t, base_dir, f"initializer {t.name!r}", read=False)
    _check(model, name, name if external else None)
    return LoadedModel(model, _opset(model, name), base_dir, name)


def _parse(data: bytes, name: str) -> onnx.ModelProto:
    if not data:
        raise OnnxModelError(f"ONNX model {name}: the file is empty")
    try:
        model = onnx.ModelProto()
        model.ParseFromString(data)
    except Exception as e:  # protobuf raises DecodeError, or RuntimeWarning-style errors for odd payloads
        raise OnnxModelError(
            f"ONNX model {name}: cannot parse the protobuf ({type(e).__name__}: {e}); the file is truncated or is not"
            " an ONNX model — re-export or re-download it"
        ) from None
    return model


def _check(model: onnx.ModelProto, name: str, path: str | None) -> None:
    """onnx's checker; a model with external data is checked from its path (already confined to its folder)."""
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise OnnxModelError(f"ONNX model {name}: it has no graph (the file is truncated or not an ONNX model)")
    try:
        onnx.checker.check_model(path if path is not None else model)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxModelError(f"ONNX model {name} is malformed: {msg}") from None


def _opset(model: onnx.ModelProto, name: str) -> int:
    versions = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise OnnxModelError(f"ONNX model {name}: it imports no version of the default ONNX operator set")
    v = max(versions)
    if not MIN_OPSET <= v <= MAX_OPSET:
        raise OnnxUnsupportedError(
            f"ONNX model {name}: opset {v} is not supported (plait runs opsets {MIN_OPSET} to {MAX_OPSET}); convert it"
            " with onnx.version_converter.convert_version(model, 17)"
        )
    return v


def _external_bytes(t: TensorProto, base_dir: Path | None, what: str, read: bool = True) -> bytes:
    info = {e.key: e.value for e in t.external_data}
    location = info.get("location", "")
    if base_dir is None:
        raise OnnxModelError(
            f"{what}: its data lives in an external file ({location!r}) but the model was given as bytes; load it"
            " from its path so the external file can be found next to it"
        )
    target = (base_dir / location).resolve()
    if not location or os.path.isabs(location) or not target.is_relative_to(base_dir):
        raise OnnxModelError(
            f"{what}: external data location {location!r} points outside the model's folder {str(base_dir)!r};"
            " refusing to read it (keep external data files next to the model)"
        )
    if not target.is_file():
        raise OnnxModelError(f"{what}: external data file {location!r} is missing from {str(base_dir)!r}")
    offset = int(info.get("offset", "0") or 0)
    size = target.stat().st_size
    length = int(info["length"]) if info.get("length") else size - offset
    if offset < 0 or length < 0 or offset + length > size:
        raise OnnxModelError(
            f"{what}: external data range [{offset}, {offset + length}) lies beyond the end of {location!r}"
            f" ({size} bytes); the file is truncated"
        )
    if not read:
        return b""
    with open(target, "rb") as f:
        f.seek(offset)
        return f.read(length)


def to_numpy(t: TensorProto, base_dir: Path | None, what: str) -> np.ndarray:
    """The array a TensorProto holds, reading external data from inside `base_dir` only."""
    if t.data_type == TensorProto.STRING:
        raise OnnxUnsupportedError(f"{what}: string tensors are not supported by plait")
    if t.data_location == TensorProto.EXTERNAL:
        inline = TensorProto()
        inline.CopyFrom(t)
        del inline.external_data[:]
        inline.data_location = TensorProto.DEFAULT
        inline.raw_data = _external_bytes(t, base_dir, what)
        t = inline
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise OnnxModelError(f"{what}: cannot decode tensor {t.name!r} ({type(e).__name__}: {e})") from None
    expect = int(np.prod(t.dims)) if t.dims else 1
    if arr.size != expect:
        raise OnnxModelError(
            f"{what}: tensor {t.name!r} holds {arr.size} values but its dims {list(t.dims)} need {expect}"
        )
    return np.asarray(arr)


def elem_np(elem_type: int) -> Any:
    """The NumPy dtype of an ONNX element type (None where NumPy has no such type)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return None


def elem_name(elem_type: int) -> str:
    try:
        return str(TensorProto.DataType.Name(elem_type)).lower()
    except ValueError:
        return f"type{elem_type}"
