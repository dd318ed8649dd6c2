"""Shared fixtures: `device` runs a test once per usable device ('cpu', each working OpenCL device).

PLAIT_TEST_DEVICES (comma-separated) narrows the list, e.g. to run the suite on a GPU only.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hyp_settings

from plait import settings
from plait.runtime.discovery import usable_devices

# `device` is a plain string, so sharing it across generated examples is safe
hyp_settings.register_profile(
    "plait",
    max_examples=settings.get("PLAIT_HYPOTHESIS_EXAMPLES"),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
hyp_settings.load_profile("plait")


def _devices() -> list[str]:
    chosen = os.environ.get("PLAIT_TEST_DEVICES")
    if chosen:
        return [d.strip() for d in chosen.split(",") if d.strip()]
    return usable_devices()


def _model_devices() -> list[str]:
    """Whole-model tests skip OpenCL drivers that run on the CPU (PoCL here), whose kernels take ~0.5 s each to
    compile on 2 cores, unless PLAIT_TEST_DEVICES names them; the op, nn, tile and ONNX tests cover those."""
    if os.environ.get("PLAIT_TEST_DEVICES"):
        return DEVICES
    from plait.runtime import get_device

    return [d for d in DEVICES if d == "cpu" or get_device(d).info.extra.get("gpu")]


DEVICES = _devices()
MODEL_DEVICES = _model_devices()


@pytest.fixture(autouse=True)
def _cpu_is_the_default_device():
    """A test that names no device runs on the cpu on every machine, as on CI: on a GPU machine the default device
    would be the GPU, and tensors made without a device would land there beside models built for the cpu. Tests
    parametrised by `device` pass theirs explicitly."""
    with settings.override(PLAIT_DEVICE="cpu"):
        yield


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=MODEL_DEVICES)
def model_device(request: pytest.FixtureRequest) -> str:
    return str(request.param)
