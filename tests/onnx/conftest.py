"""Helpers for ONNX tests: export PyTorch modules to ONNX bytes in the test (no committed binaries)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnxruntime as ort
import torch


def export(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    opset: int = 17,
    dynamic_batch: bool = False,
    names: tuple[list[str], list[str]] | None = None,
) -> bytes:
    """The ONNX bytes of `module` exported by PyTorch's TorchScript exporter (eval mode, constants folded)."""
    module.eval()
    ins, outs = names or ([f"input{i}" for i in range(len(args))], ["output"])
    axes = {n: {0: "batch"} for n in ins + outs} if dynamic_batch else None
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            buf,
            opset_version=opset,
            dynamo=False,
            input_names=ins,
            output_names=outs,
            dynamic_axes=axes,
            do_constant_folding=True,
        )
    return buf.getvalue()


def ort_run(model: bytes, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    return list(sess.run(None, feed))
