"""A replayed `cpu` plan runs its kernels as the steps of one OpenMP parallel region (plait/runtime/cpu.py
`plait_run_team`, the kernels' team entries from plait/codegen/c.py): the results must be those of the same kernels
launched one by one and of PyTorch, on one thread and on two, for every kernel family (elementwise and reductions
with and without worksharing, the GEMM with a shared packing of B over k blocks, the GEMV, implicit-GEMM and
depthwise convolutions, Winograd over several chunks of tile blocks); a kernel that opens its own parallel region
runs as a launch of its own between team runs; the team has the threads OpenMP is set to use."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

import plait
import plait.nn.functional as F
from plait import settings
from plait.codegen.cstyle import RenderedKernel
from plait.runtime import get_device
from plait.runtime.base import Buffer, Device, join_sources
from plait.runtime.cpu import TeamRun
from plait.schedule.plan import Launch, Plan, read, run_launches


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.float64)


def _both(plan: Plan, *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plan's first output replayed as one team run, then kernel by kernel (the output poisoned before each)."""
    out = plan.outputs[0]
    buf = plan.buffers[out.uid]
    poison = np.full(out.shape, np.nan, out.dtype.np)
    plan.device.allocator.copy_in(buf, poison)
    team = plan(*arrays)[0]
    plan.device.allocator.copy_in(buf, poison)
    run_launches(plan.device, plan.launches)
    return team, read(plan.device, buf, out)


def _team_runs(plan: Plan) -> int:
    return sum(isinstance(r, TeamRun) for r in plan.replay)


def test_small_cnn_matches_per_kernel_launches_and_torch(threads: int) -> None:
    """Implicit-GEMM convolution with a bias+ReLU epilogue, a strided depthwise convolution with ReLU6, a 1x1
    convolution, a max pool, a mean (a reduction) and a linear layer at batch 1 (the GEMV)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 23, 21)).astype(np.float32)
    w1, b1 = (rng.standard_normal((32, 6, 3, 3)) / 7).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    wd = (rng.standard_normal((32, 1, 3, 3)) / 3).astype(np.float32)
    w2 = (rng.standard_normal((48, 32, 1, 1)) / 6).astype(np.float32)
    wl, bl = (rng.standard_normal((10, 48)) / 7).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    p = {k: plait.tensor(v, device="cpu") for k, v in dict(w1=w1, b1=b1, wd=wd, w2=w2, wl=wl, bl=bl).items()}

    def net(t: plait.Tensor) -> plait.Tensor:
        y = F.conv2d(t, p["w1"], p["b1"], padding=1).relu()
        y = F.conv2d(y, p["wd"], None, 2, 1, 1, 32).clip(0.0, 6.0)
        y = F.max_pool2d(F.conv2d(y, p["w2"]), 2)
        return F.linear(y.mean(axis=(2, 3)), p["wl"], p["bl"])

    with settings.override(PLAIT_WINOGRAD="off"):
        f = plait.jit(net, device="cpu")
        plan, _ = f.plan_for([x])
    assert _team_runs(plan) >= 1 and len(plan.replay) < len(plan.launches)
    team, alone = _both(plan, x)
    np.testing.assert_array_equal(team, alone)
    tw = {k: _t(v) for k, v in dict(w1=w1, b1=b1, wd=wd, w2=w2, wl=wl, bl=bl).items()}
    y = torch.relu(torch.nn.functional.conv2d(_t(x), tw["w1"], tw["b1"], padding=1))
    y = torch.clamp(torch.nn.functional.conv2d(y, tw["wd"], None, 2, 1, 1, 32), 0.0, 6.0)
    y = torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(y, tw["w2"]), 2)
    ref = torch.nn.functional.linear(y.mean(dim=(2, 3)), tw["wl"], tw["bl"]).numpy()
    np.testing.assert_allclose(team, ref, rtol=1e-4, atol=1e-4)


def test_gemm_with_shared_packing_and_elementwise_chain(threads: int) -> None:
    """A tall product (rows split into tasks that share one packing of B, two k blocks) between elementwise kernels
    with and without worksharing, and a row sum."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((256, 300)).astype(np.float32)
    b = rng.standard_normal((300, 48)).astype(np.float32)

    def fn(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        return ((x * 0.5).exp() @ y).tanh().sum(axis=1) + 1.0

    f = plait.jit(fn, device="cpu")
    plan, _ = f.plan_for([a, b])
    assert len(plan.launches) >= 3 and _team_runs(plan) == 1 and len(plan.replay) == 1
    team, alone = _both(plan, a, b)
    np.testing.assert_array_equal(team, alone)
    ref = (torch.tanh(torch.exp(_t(a) * 0.5) @ _t(b)).sum(dim=1) + 1.0).numpy()
    np.testing.assert_allclose(team, ref, rtol=2e-5, atol=2e-4)


def test_winograd_over_several_chunks_of_tile_blocks(threads: int) -> None:
    """F(2,3) with more transformed input tiles than one chunk holds: the team waits before the next chunk's input
    transform overwrites the shared tiles, then a residual add after it."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 128, 48, 48)).astype(np.float32)
    w = (rng.standard_normal((8, 128, 3, 3)) / 34).astype(np.float32)
    r = rng.standard_normal((2, 8, 48, 48)).astype(np.float32)
    weight = plait.tensor(w, device="cpu")
    with settings.override(PLAIT_WINOGRAD="2"):
        f = plait.jit(lambda t, s: (F.conv2d(t, weight, None, padding=1) * 2.0).relu() - s.sigmoid(), device="cpu")
        plan, _ = f.plan_for([x, r])
    assert "WINO2" in [k.name.split("_")[0] for k in plan.kernels]
    team, alone = _both(plan, x, r)
    np.testing.assert_array_equal(team, alone)
    ref = torch.relu(torch.nn.functional.conv2d(_t(x), _t(w), None, padding=1) * 2.0) - torch.sigmoid(_t(r))
    np.testing.assert_allclose(team, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_compiled_training_step_replays_as_team_runs(threads: int) -> None:
    """A plait.compile_step replay (forward, backward, SGD with momentum) runs its kernels as team runs and keeps
    the parameters PyTorch's eager steps give."""
    torch.manual_seed(0)
    tm = torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(100, 3)
    )
    pm = plait.nn.Sequential(
        plait.nn.Conv2d(2, 4, 3, padding=1), plait.nn.ReLU(), plait.nn.Flatten(), plait.nn.Linear(100, 3)
    ).to("cpu")
    pm.load_state_dict(tm.state_dict())
    topt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9)
    popt = plait.optim.SGD(pm.parameters(), lr=0.1, momentum=0.9)

    @plait.compile_step(device="cpu")
    def step(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
        popt.zero_grad()
        loss = plait.nn.functional.cross_entropy(pm(x), y)
        loss.backward()
        popt.step()
        return loss

    rng = np.random.default_rng(3)
    for _ in range(5):  # call 1 eager, 2-3 traced, 4-5 replayed
        x, y = rng.standard_normal((4, 2, 5, 5)).astype(np.float32), rng.integers(0, 3, 4)
        step(x, y)
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tm(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        topt.step()
    replay = next(iter(step.traces.values())).replay
    assert replay is not None and any(isinstance(c, TeamRun) for c in replay.launches)
    got = pm.state_dict()
    for name, want in tm.state_dict().items():
        np.testing.assert_allclose(got[name].numpy(), want.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


_PROBE = """#include <omp.h>
void plait_probe_%s(int* out) {
  out[0] = omp_get_num_threads();
  out[1] = omp_get_level();
}
void plait_probe_%s_team(void* const* a) {
  int* out = a[0];
#pragma omp single nowait
  { out[0] = omp_get_num_threads(); out[1] = omp_get_level(); }
}
"""

_ALONE = """void plait_alone(int* out, const int* a, const int* b) {
#pragma omp parallel for
  for (int i = 0; i < 4; i++) out[i] = a[i] + b[i];
}
"""


def _ints(device: Device, values: list[int]) -> Buffer:
    buf = device.allocator.alloc(4 * len(values))
    device.allocator.copy_in(buf, np.array(values, np.int32))
    return buf


def _read(device: Device, buf: Buffer, n: int) -> list[int]:
    out = np.empty(n, np.int32)
    device.allocator.copy_out(buf, out)
    return out.tolist()


def test_team_runs_split_around_a_kernel_that_opens_its_own_region(threads: int) -> None:
    """Steps run inside one region of the configured thread count; a kernel without a team entry runs alone (its
    own region, not nested in the team's) between two team runs."""
    device = get_device("cpu")
    first, second = (device.compile(_PROBE % (s, s), f"plait_probe_{s}") for s in ("a", "b"))
    alone = device.compile(_ALONE, "plait_alone")
    assert first.team is not None and alone.team is None
    k = RenderedKernel("probe", "", (1,), None)
    out = [_ints(device, [0, 0]) for _ in range(4)]
    a, b, s = _ints(device, [1, 2, 3, 4]), _ints(device, [10, 20, 30, 40]), _ints(device, [0] * 4)
    launches = [
        Launch(first, k, [out[0]]),
        Launch(second, k, [out[1]]),
        Launch(alone, k, [s, a, b]),
        Launch(first, k, [out[2]]),
        Launch(second, k, [out[3]]),
    ]
    chained = device.chain(launches)
    assert [isinstance(c, TeamRun) for c in chained] == [True, False, True]
    run_launches(device, chained)
    assert [_read(device, o, 2) for o in out] == [[threads, 1]] * 4
    assert _read(device, s, 4) == [11, 22, 33, 44]


def test_kernels_sharing_a_helper_build_as_one_translation_unit() -> None:
    """Two kernels whose sources define the same helper (integer power) still join into one library: the text
    before each kernel's body function is kept once."""
    device = get_device("cpu")
    f = plait.jit(lambda a, b: (a**b).sum(axis=1) + ((a + 1) ** b).sum(axis=0)[:3], device="cpu")
    a, b = np.arange(12, dtype=np.int32).reshape(3, 4) % 5, np.full((3, 4), 3, np.int32)
    plan, _ = f.plan_for([a, b])
    pairs = [(k.source, k.name) for k in plan.kernels if "plait_ipow(" in k.source]
    assert len(pairs) == 2
    joined = join_sources(pairs)
    assert joined.count("long plait_ipow(") == 1
    device._build(joined)
    np.testing.assert_array_equal(f(a, b), (a**b).sum(axis=1) + ((a + 1) ** b).sum(axis=0)[:3])


def test_team_size_follows_plait_num_threads_whatever_openmp_read_first(tmp_path: Any) -> None:
    """PLAIT_NUM_THREADS decides a team run's threads even when torch loaded libgomp first and OMP_NUM_THREADS
    says otherwise (a process that imports torch before plait)."""
    script = f"""
import torch  # loads libgomp, which reads OMP_NUM_THREADS=1 now
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from plait.codegen.cstyle import RenderedKernel
from plait.runtime import get_device
from plait.schedule.plan import Launch, run_launches
from tests.ops.test_team_run import _PROBE, _ints, _read
device = get_device("cpu")
progs = [device.compile(_PROBE % (s, s), f"plait_probe_{{s}}") for s in ("a", "b")]
k = RenderedKernel("probe", "", (1,), None)
out = [_ints(device, [0, 0]) for _ in progs]
run_launches(device, device.chain([Launch(p, k, [o]) for p, o in zip(progs, out)]))
print([_read(device, o, 2) for o in out])
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PLAIT_NUM_THREADS": "3", "PLAIT_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[[3, 1], [3, 1]]"


_AFFINITY = """
import os, sys
sys.path.insert(0, {root!r})
import numpy as np
import plait
import plait.nn.functional as F
w = plait.tensor(np.ones((64, 16, 3, 3), np.float32) / 9, device="cpu")
f = plait.jit(lambda t: F.conv2d(t, w, None, padding=1).relu().mean(axis=(2, 3)), device="cpu")
x = np.ones((1, 16, 40, 40), np.float32)
for _ in range(3):
    got = np.asarray(f(x))
assert np.allclose(got, 16 * np.ones((1, 64)) * (38 * 38 + 4 * 38 * 6 / 9 + 4 * 4 / 9) / 1600, rtol=1e-4), got
masks = {{}}
for tid in os.listdir("/proc/self/task"):
    for line in open(f"/proc/self/task/{{tid}}/status"):
        if line.startswith("Cpus_allowed_list:"):
            masks[int(tid)] = line.split()[1]
print(masks.pop(os.getpid()), sorted(masks.values()))
"""


def test_team_workers_keep_a_cpu_of_their_own_and_the_caller_none(tmp_path: Any) -> None:
    """With PLAIT_PIN_THREADS=1 (the default) a two-thread team's worker ends up pinned to one CPU and the calling
    thread keeps the process's mask; with 0 nothing is pinned. Both compute the same result."""
    allowed = os.sched_getaffinity(0)
    script = _AFFINITY.format(root=str(Path(__file__).resolve().parents[2]))
    outs = {}
    for pin in ("1", "0"):
        env = {**os.environ, "PLAIT_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "PLAIT_PIN_THREADS": pin}
        env["PLAIT_CACHE_DIR"] = str(tmp_path)
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outs[pin] = done.stdout.strip().splitlines()[-1]
    caller, others = outs["1"].split(" ", 1)
    full = outs["0"].split(" ", 1)[0]
    assert caller == full  # the calling thread is never pinned
    if len(allowed) >= 2:
        singles = [m for m in ast.literal_eval(others) if m.isdigit()]
        assert len(singles) == 1, outs
    assert all(m == full for m in ast.literal_eval(outs["0"].split(" ", 1)[1])), outs
