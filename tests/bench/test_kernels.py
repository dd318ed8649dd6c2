"""The per-kernel report (plait.explain(..., kernels=True), plait bench --kernels): each kernel's work is counted
from its plan item, its time is a real replay, and the totals are the sums of the rows."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

import plait
from plait.bench.models import BenchModel
from plait.cli import main
from plait.schedule.profile import KernelReport, format_report, profile_plan, profile_plans

RNG = np.random.default_rng(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def _check_consistent(report: KernelReport) -> dict:
    """Rows sorted slowest first, every time > 0, rates derived from the counts, totals equal to the row sums."""
    d = report.as_dict()
    rows = d["kernels"]
    assert rows and all(r["time_s"] > 0 for r in rows)
    assert [r["time_s"] for r in rows] == sorted((r["time_s"] for r in rows), reverse=True)
    for r in rows:
        assert r["gflops"] == pytest.approx(r["flops"] / r["time_s"] / 1e9)
        assert r["gbps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["flop_peak_pct"] == pytest.approx(100 * r["gflops"] / d["peak_gflops"])
        assert r["bw_peak_pct"] == pytest.approx(100 * r["gbps"] / d["peak_gbps"])
    t = d["totals"]
    assert t["kernels"] == len(rows)
    assert t["time_s"] == pytest.approx(sum(r["time_s"] for r in rows))
    assert t["flops"] == sum(r["flops"] for r in rows) and t["bytes"] == sum(r["bytes"] for r in rows)
    assert t["gflops"] == pytest.approx(t["flops"] / t["time_s"] / 1e9)
    assert d["peak_gflops"] > 0 and d["peak_gbps"] > 0 and d["replay_s"] > 0
    kinds = d["by_kind"]
    assert set(kinds) == {r["kind"] for r in rows}
    for kind, agg in kinds.items():
        mine = [r for r in rows if r["kind"] == kind]
        assert agg["kernels"] == len(mine) and agg["flops"] == sum(r["flops"] for r in mine)
        assert agg["time_s"] == pytest.approx(sum(r["time_s"] for r in mine))
    assert sum(a["time_s"] for a in kinds.values()) == pytest.approx(t["time_s"])
    json.dumps(d)  # JSON-ready
    return d


def test_gemm_flops_and_bytes(device: str) -> None:
    batch, m, k, n = 3, 24, 40, 56
    f = plait.jit(lambda a, b: a @ b, device=device)
    a, b = _rand(batch, m, k), _rand(batch, k, n)
    np.testing.assert_allclose(f(a, b), a @ b, rtol=1e-4, atol=1e-4)
    report = plait.explain(f, a, b, reps=3)
    assert isinstance(report, KernelReport) and report.device == device
    d = _check_consistent(report)
    (row,) = d["kernels"]
    assert row["kind"] == "gemm" and row["shape"] == f"b{batch} m{m} n{n} k{k}"
    assert row["flops"] == 2 * m * n * k * batch
    assert row["bytes"] == 4 * batch * (m * k + k * n + m * n)


def test_epilogue_and_reduction_work() -> None:
    m, k, n = 16, 32, 48
    x, w, bias = _rand(m, k), _rand(k, n), _rand(n)

    def fn(x: plait.Tensor, w: plait.Tensor, b: plait.Tensor) -> tuple[plait.Tensor, plait.Tensor]:
        y = ((x @ w) + b).relu()
        return y, y.sum(axis=1)

    f = plait.jit(fn, device="cpu")
    y, s = f(x, w, bias)
    np.testing.assert_allclose(y, np.maximum(x @ w + bias, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(s, np.maximum(x @ w + bias, 0).sum(axis=1), rtol=1e-4, atol=1e-3)
    d = _check_consistent(plait.explain(f, x, w, bias, reps=3))
    by_kind = {r["kind"]: r for r in d["kernels"]}
    gemm = by_kind["gemm"]
    assert gemm["flops"] == 2 * m * n * k + 2 * m * n  # the fused bias add and relu: one FLOP each per element
    assert gemm["ops"] == "matmul+relu+add"
    assert gemm["bytes"] == 4 * (m * k + k * n + n + m * n)
    red = by_kind["reduce"]
    assert red["flops"] == m * n and red["bytes"] == 4 * (m * n + m) and red["shape"] == f"{m}x{n} -> {m}x1"


def test_small_model_totals() -> None:
    """A small CNN: every launch of the plan is in the report once, and each GEMM's FLOPs are those of its layer."""
    model = plait.nn.Sequential(
        plait.nn.Conv2d(3, 8, 3, padding=1),
        plait.nn.ReLU(),
        plait.nn.Flatten(),
        plait.nn.Linear(8 * 12 * 12, 10),
    ).to("cpu")
    f = plait.jit(lambda t: model(t), device="cpu")
    x = _rand(2, 3, 12, 12)
    f(x)
    plan, _ = f.plan_for([x])
    report = profile_plan(plan, reps=3)
    d = _check_consistent(report)
    assert sorted(r["index"] for r in d["kernels"]) == list(range(len(plan.launches)))
    gemm_flops = sorted(r["flops"] - _epilogue(r) for r in d["kernels"] if r["kind"] == "gemm")
    conv = 2 * 8 * (12 * 12) * (3 * 3 * 3) * 2  # 2 * Cout * H*W * Cin*kh*kw * batch
    linear = 2 * 2 * 10 * (8 * 12 * 12)
    assert gemm_flops == sorted([conv, linear])
    text = str(report)
    assert "**total**" in text and f"{len(plan.launches)} kernels on cpu" in text


def _epilogue(row: dict) -> int:
    """The FLOPs a GEMM row's fused epilogue adds: one per op per output element (m*n*batch)."""
    b, m, n, _k = (int(p[1:]) for p in row["shape"].split())
    ops = row["ops"].split("+")[1:]
    return len(ops) * b * m * n


def test_torch_explain_kernels() -> None:
    torch = pytest.importorskip("torch")
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 5))
    e = plait.explain(m.eval(), torch.randn(1, 3, 8, 8), device="cpu", kernels=True, reps=2)
    assert e.kernel_report is not None and len(e.kernel_report.kernels) == e.kernels
    assert all(k.group.startswith("inference/") for k in e.kernel_report.kernels)
    _check_consistent(e.kernel_report)
    assert "**total**" in str(e)
    assert plait.explain(m, torch.randn(1, 3, 8, 8), device="cpu").kernel_report is None  # unchanged by default


def test_onnx_session_explain() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    import io

    from plait.onnx import InferenceSession

    model = torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh()).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the exporter's deprecation notices are not this test's subject
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(3, 6),), buf, input_names=["x"], opset_version=17, dynamo=False)
    sess = InferenceSession(buf.getvalue(), device="cpu")
    d = _check_consistent(plait.explain(sess, {"x": _rand(3, 6)}, reps=2))
    assert sum(r["kind"] == "gemm" for r in d["kernels"]) == 1
    with pytest.raises(plait.PlaitError, match="one feed dict"):
        plait.explain(sess, _rand(3, 6))


def test_errors() -> None:
    with pytest.raises(plait.PlaitError, match="no compiled plan"):
        profile_plans([])
    with pytest.raises(plait.PlaitError, match="cannot explain a int"):
        plait.explain(3)
    f = plait.jit(lambda a: a * 2.0, device="cpu")
    with pytest.raises(plait.PlaitError, match="reps must be at least 1"):
        plait.explain(f, _rand(4), reps=0)
    with pytest.raises(plait.PlaitError, match="training=True"):
        plait.explain(f, _rand(4), training=True)


def test_format_limit() -> None:
    f = plait.jit(lambda a, b: (a @ b).sum(axis=0), device="cpu")
    d = plait.explain(f, _rand(8, 8), _rand(8, 8), reps=2).as_dict()
    short = format_report(d, limit=1)
    assert "... 1 more" in short and short.count("| gemm |") + short.count("| reduce |") == 1
    assert math.isclose(d["totals"]["time_s"], sum(r["time_s"] for r in d["kernels"]))


def test_bench_kernels_flag(tiny: BenchModel, tmp_path: Path, thread_env: None) -> None:
    out = tmp_path / "out"
    argv = ["bench", "--models", "tiny", "--modes", "infer-1", "--frameworks", "plait,torch", "--device", "cpu"]
    argv += ["--iters", "3", "--warmup", "1", "--tasks", "none", "--no-progress", "--kernels", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    cells = {c["framework"]: c for c in result["cells"]}
    assert "kernels" not in cells["torch"] and result["settings"]["kernel_report"] is True
    report = cells["plait:cpu"]["kernels"]
    assert report["reps"] == 3 and report["totals"]["kernels"] == len(report["kernels"]) >= 1
    gemms = [r for r in report["kernels"] if r["kind"] == "gemm"]
    assert sorted(r["flops"] - _epilogue(r) for r in gemms) == sorted([2 * 8 * 16, 2 * 16 * 3])  # batch 1
    md = (out / "results.md").read_text()
    assert "## kernels" in md and "### tiny infer-1 b1 plait:cpu" in md and "**total**" in md
    assert "### tiny infer-1 b1 plait:cpu" in (out / "kernels.md").read_text()
    assert "<h2>kernels</h2>" in (out / "report.html").read_text()


def test_report_sections_name_a_failed_report(tmp_path: Path) -> None:
    from plait.bench import report
    from tests.bench.test_report import _result

    result = _result()
    result["cells"][0]["kernels"] = {"error": "PlaitError: kernel report: there is no compiled plan"}
    md = report.markdown(result)
    assert "### resnet18 infer-1 b1 plait:cpu" in md and "no kernel report: PlaitError" in md
    paths = report.write_all(result, tmp_path)
    assert "no kernel report" in paths["kernels"].read_text()


def test_winograd_and_fused_block_count_their_direct_products() -> None:
    """A cpu Winograd convolution counts the direct convolution's FLOPs, a fused inverted-residual block those of its
    expand, depthwise and projection products (its expand an image stem's 27 taps here), not zero."""
    import plait.nn.functional as F

    w = plait.tensor(_rand(32, 32, 3, 3) * 0.05, device="cpu")
    wino = plait.jit(lambda t: F.conv2d(t, w, padding=1).relu(), "cpu")
    x = _rand(1, 32, 28, 28)
    (row,) = _check_consistent(plait.explain(wino, x, reps=2))["kernels"]
    assert row["kind"] == "winograd" and row["flops"] == 2 * 32 * 28 * 28 * 32 * 9

    c1, m2 = 48, 16
    w0, wd, w2 = (plait.tensor(a, device="cpu") for a in (_rand(c1, 3, 3, 3), _rand(c1, 1, 3, 3), _rand(m2, c1, 1, 1)))

    def block(t: plait.Tensor) -> plait.Tensor:
        a = F.conv2d(t, w0, stride=2, padding=1).clip(0.0, 6.0)
        return F.conv2d(F.conv2d(a, wd, padding=1, groups=c1).clip(0.0, 6.0), w2)

    image = _rand(2, 3, 32, 32)
    d = _check_consistent(plait.explain(plait.jit(block, "cpu"), image, reps=2))
    (row,) = d["kernels"]
    assert row["kind"] == "irblock"
    assert row["flops"] == 2 * 2 * (27 * c1 * 16 * 16 + 9 * c1 * 16 * 16 + c1 * m2 * 16 * 16)
