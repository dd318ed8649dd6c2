"""Compiled plans: fusion into one kernel, byte-identical source for the same graph, replay with new inputs, the
kernel cache surviving corrupt entries, and build failures reported as CompileError naming the op and shapes."""

import numpy as np
import pytest

import plait
import plait.schedule.plan as plan_module
from plait import settings
from plait.dtypes import float32
from plait.errors import CompileError
from plait.graph.node import Node
from plait.runtime import cache, get_device
from plait.schedule.plan import Plan
from tests.helpers import assert_close, rand


def _chain(x: plait.Tensor, y: plait.Tensor) -> plait.Tensor:
    return ((x * 2 + y).relu() - x.T.exp() / (y + 3)).sigmoid().maximum(0.25)


def _chain_np(a, b):
    z = np.maximum(a * 2 + b, 0) - np.exp(a.T) / (b + 3)
    return np.maximum(1 / (1 + np.exp(-z)), 0.25)


def test_elementwise_chain_fuses_into_one_kernel(device):
    a, b = rand((4, 4), seed=1), rand((4,), seed=2)
    out = _chain(plait.tensor(a, device=device), plait.tensor(b, device=device))
    plan = Plan([out.node])
    assert len(plan.kernels) == 1, [k.name for k in plan.kernels]
    plan.run()
    assert_close(
        plait.schedule.plan.read(plan.device, plan.buffers[out.node.uid], out.node), _chain_np(a, b), "float32", "fused"
    )


def test_reduction_with_elementwise_prologue_and_epilogue_is_two_kernels(device):
    t = plait.tensor(rand((5, 6), seed=3), device=device)
    out = (t * 2).exp().sum(axis=1) + 1
    assert len(Plan([out.node]).kernels) == 2  # the reduce reads the fused prologue; the epilogue is its own kernel


def test_same_graph_gives_byte_identical_source(device):
    def build():
        x = plait.tensor(rand((4, 4), seed=4), device=device)
        y = plait.tensor(rand((4,), seed=5), device=device)
        outs = [_chain(x, y), (x @ x.T).sum(axis=0), x[::-1, 1:].pad(((1, 0), (0, 2))).max(axis=1)]
        return [k.source for k in Plan([o.node for o in outs]).kernels]

    first, second = build(), build()
    assert len(first) >= 3
    assert first == second


def test_plan_replays_with_new_inputs(device):
    x = Node("input", (), None, (4, 4), float32, device)
    y = Node("input", (), None, (4,), float32, device)
    out = _chain(plait.Tensor(x), plait.Tensor(y))
    total = (plait.Tensor(x) @ plait.Tensor(x)).sum(axis=0)
    plan = Plan([out.node, total.node], [x, y])
    n_kernels = len(plan.kernels)
    for seed in (10, 20, 30):
        a, b = rand((4, 4), seed=seed), rand((4,), seed=seed + 1)
        got, got_total = plan(a, b)
        assert_close(got, _chain_np(a, b), "float32", f"replay {seed} on {device}")
        assert_close(got_total, (a @ a).sum(axis=0), "float32", f"replay {seed} on {device}", tol_scale=10)
    assert len(plan.kernels) == n_kernels  # replay compiles nothing
    with pytest.raises(plait.PlaitError, match="shape"):
        plan(rand((3, 4)), rand((4,)))
    with pytest.raises(plait.PlaitError, match="2 inputs"):
        plan(rand((4, 4)))


def _fresh_kernel(device, tag: float):
    """A tensor whose kernel source is unique to this test run (so nothing is cached in memory)."""
    a = rand((8,), seed=6)
    return a, plait.tensor(a, device=device) * tag + 1


def test_corrupt_and_truncated_cache_entries_are_rebuilt(device, tmp_path):
    tag = float(np.random.default_rng().integers(1, 10**6)) + 0.5
    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        a, t = _fresh_kernel(device, tag)
        assert_close(t.numpy(), a * np.float32(tag) + 1, "float32", "first build")
        kind = get_device(device).info.kind
        entries = [p for p in (tmp_path / kind).iterdir() if not p.name.startswith(".")]
        assert entries, f"no cache entry written under {tmp_path / kind}"
        for i, path in enumerate(entries):
            raw = path.read_bytes()
            path.write_bytes(raw[: len(raw) // 2] if i % 2 else b"garbage" + raw[20:])
        get_device(device)._programs.clear()  # type: ignore[attr-defined]  # forget the in-memory programs
        plan_module._RECIPES.clear()  # and the replay recipes, so the same graph is compiled again
        a2, t2 = _fresh_kernel(device, tag)
        assert_close(t2.numpy(), a2 * np.float32(tag) + 1, "float32", "after corruption")
        for path in entries:
            assert cache.get(kind, path.name) is not None, "the damaged entry was not rewritten"


def test_kernel_build_failure_names_op_shapes_and_what_to_do(device, monkeypatch):
    dev = get_device(device)

    def broken(source: str, kernel_name: str):
        raise CompileError(f"{device}: the compiler rejected {kernel_name}: error: simulated")

    monkeypatch.setattr(dev, "compile", broken)
    monkeypatch.setattr(dev, "compile_batch", lambda ks: [broken(s, n) for s, n in ks])
    t = plait.tensor(rand((2, 3), seed=7), device=device)
    with pytest.raises(CompileError) as e:
        (t * 123.25 + 7).numpy()
    msg = str(e.value)
    assert isinstance(e.value, plait.PlaitError)
    assert "(2, 3)" in msg and "add" in msg and "simulated" in msg and "PLAIT_DUMP_DIR" in msg


def test_opencl_probe_reports_a_device_that_cannot_build(monkeypatch):
    from plait.runtime import opencl

    found = [d for _, d, why in opencl.discover() if d is not None and why is None]
    if not found:
        pytest.skip("no OpenCL device to probe")
    cl = opencl._cl()

    class Broken:
        def __init__(self, *args, **kwargs):
            pass

        def build(self, *args, **kwargs):
            raise cl.RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE (simulated)")

    monkeypatch.setattr(cl, "Program", Broken)
    why = opencl._probe(cl, found[0])
    assert why is not None and "cannot build" in why and "simulated" in why


def test_cpu_entry_with_valid_checksum_but_unloadable_library_is_rebuilt(tmp_path):
    import plait.runtime.cpu as cpu

    with settings.override(PLAIT_CACHE_DIR=str(tmp_path)):
        dev = get_device("cpu")
        name = f"k_unloadable_{np.random.default_rng().integers(10**9)}"
        src = f"void {name}(float* restrict b0) {{ b0[0] = 7.0f; }}\n"
        key = cache.key_of("cpu", dev.info.driver, " ".join(cpu.FLAGS + getattr(cpu, "LIBS", [])), src)
        cache.put("cpu", key, b"\x7fELF not a shared object")
        dev.compile(src, name)
