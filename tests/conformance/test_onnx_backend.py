"""The ONNX backend conformance suite (onnx.backend.test node tests) against plait.onnx.backend.

The full node suite runs on `cpu`; on each usable OpenCL device (PoCL in CI) the tests of the target operators
(CNN, RNN and transformer ops) run. Every exclusion is listed with its reason in exclusions.py; docs/onnx.md has
the pass count and operator coverage (tools/onnx_coverage.py). PLAIT_CONFORMANCE=0 turns the suite off.
"""

from __future__ import annotations

import os
import re
import warnings

import onnx.backend.test

from plait.onnx.backend import backend_for
from tests.conformance.exclusions import EXCLUDED, TARGET_OPS
from tests.conftest import DEVICES

warnings.filterwarnings("ignore", category=RuntimeWarning)

CATEGORY = "OnnxBackendNodeModelTest"


def _suite(device: str, include: list[str]) -> type:
    bt = onnx.backend.test.BackendTest(backend_for(device), __name__)
    for pattern in include:  # none: every node test (only the node category is exported below)
        bt.include(pattern)
    for name in EXCLUDED:
        bt.exclude(f"^{re.escape(name)}_cpu$")
    bt.exclude("_cuda$")  # plait takes inputs from host memory: ONNX's "CUDA" device variant does not apply
    cls = bt.test_cases[CATEGORY]
    # excluded tests (each with its reason in exclusions.py) are removed rather than reported as skipped, so the
    # run's output counts only tests that ran
    for attr in [a for a in vars(cls) if a.startswith("test_")]:
        if getattr(getattr(cls, attr), "__unittest_skip__", False):
            delattr(cls, attr)
    return cls


if os.environ.get("PLAIT_CONFORMANCE", "1") != "0":
    if "cpu" in DEVICES:
        OnnxNodeTestsCpu = _suite("cpu", [])
    for _dev in [d for d in DEVICES if d.startswith("opencl")]:
        _name = "OnnxNodeTests" + re.sub(r"\W", "_", _dev).title().replace("_", "")
        globals()[_name] = _suite(_dev, [f"^{p}.*_cpu$" for p in TARGET_OPS])
