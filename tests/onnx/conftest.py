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


def compare_with_ort(
    model: bytes, feed: dict[str, np.ndarray], device: str, rtol: float = 1e-3, atol: float = 1e-4
) -> None:
    """plait.onnx's outputs of `model` on `device` equal ONNX Runtime's: count, shape, dtype and values (atol scales
    with the largest reference value)."""
    from plait.onnx import InferenceSession

    want = ort_run(model, feed)
    got = InferenceSession(model, device=device).run(None, feed)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max())))
