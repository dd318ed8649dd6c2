"""A plan's large inputs are copied in by the team's threads (plait_copy_team, CPUAllocator.copy_in): every byte
lands, whatever the size's remainder against the threads' 64-byte cuts, at 1, 2 and 3 threads, and a plan over such
an input matches NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import plait
from plait.runtime import cpu, get_device


@pytest.mark.parametrize("floats", [cpu.COPY_TEAM_BYTES // 4, cpu.COPY_TEAM_BYTES // 4 + 3, 3_000_017])
def test_copy_in_lands_every_byte(floats: int, team_size: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        plait.settings, "get", lambda name, _get=plait.settings.get: 0 if name == "PLAIT_NUM_THREADS" else _get(name)
    )
    dev = get_device("cpu")
    src = np.random.default_rng(floats).standard_normal(floats).astype(np.float32)
    buf = dev.allocator.alloc(src.nbytes)
    buf.handle[:] = 0
    dev.allocator.copy_in(buf, src)
    out = np.empty_like(src)
    dev.allocator.copy_out(buf, out)
    np.testing.assert_array_equal(out, src)


def test_plan_over_a_large_input_matches_numpy() -> None:
    x = np.random.default_rng(0).standard_normal((4, 3, 224, 224)).astype(np.float32)  # 2.4 MB
    f = plait.jit(lambda t: (t * 2.0 + 1.0).relu(), "cpu")
    for scale in (1.0, -1.0):
        np.testing.assert_allclose(f(x * scale), np.maximum(x * scale * 2.0 + 1.0, 0.0), rtol=1e-6)
