"""The cpu kernels at every vector width they are written for (4, 8 and 16 floats, plait/codegen/simd.py), not only
the host's: each width other than the host's runs tests/unit/vector_width_check.py in a fresh process (the width is
fixed when plait's C code generators are imported) with PLAIT_CPU_VECTOR set. A width wider than the host's computes
right but slowly, so the inputs are small; the host's own width is what the rest of the suite runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from plait.codegen import simd

OTHER_WIDTHS = [w for w in simd.WIDTHS if w != simd.vector_width()]


@pytest.mark.parametrize("width", OTHER_WIDTHS)
def test_cpu_kernels_match_torch_at_vector_width(width: int) -> None:
    script = Path(__file__).with_name("vector_width_check.py")
    env = {**os.environ, "PLAIT_CPU_VECTOR": str(width), "PLAIT_DEVICE": "cpu"}
    res = subprocess.run(
        [sys.executable, str(script), str(width)], env=env, capture_output=True, text=True, timeout=1200
    )
    assert res.returncode == 0, f"width {width}:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}"
    assert res.stdout.count("ok ") == 10, res.stdout


def test_vector_width_setting_is_checked() -> None:
    env = {**os.environ, "PLAIT_CPU_VECTOR": "12"}
    code = "from plait.codegen import simd; simd.vector_width()"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "PLAIT_CPU_VECTOR=12" in res.stderr and "4, 8 or 16" in res.stderr
