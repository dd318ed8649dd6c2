"""`plait bench` end to end on a tiny model, and its user errors: one line on stderr, exit code 2, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plait.bench.models import BenchModel
from plait.cli import main
from tests.bench.conftest import write_cifar


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--models", "resnet9000"], "unknown model 'resnet9000'"),
        (["--frameworks", "torch,caffe"], "unknown framework 'caffe'"),
        (["--modes", "infer-2"], "unknown mode 'infer-2'"),
        (["--tasks", "mnist"], "unknown task 'mnist'"),
        (["--tasks", "cifar", "--cifar", "/no/such/folder"], "--cifar /no/such/folder: no such folder"),
        (["--tasks", "imdb", "--imdb", "/no/such/imdb.npz"], "--imdb /no/such/imdb.npz: no such file"),
        (["--check", "/no/such/ref.json"], "--check /no/such/ref.json: no such file"),
        (["--iters", "0"], "--iters must be positive"),
    ],
)
def test_user_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str], thread_env: None) -> None:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_data_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], thread_env: None) -> None:
    folder = write_cifar(tmp_path / "cifar")
    (folder / "data_batch_1").write_bytes(b"garbage")
    (tmp_path / "imdb.npz").write_text("garbage")
    assert main(["bench", "--tasks", "cifar", "--cifar", str(folder)]) == 2
    assert "is not a CIFAR-10 python batch" in capsys.readouterr().err
    assert main(["bench", "--tasks", "imdb", "--imdb", str(tmp_path / "imdb.npz")]) == 2
    assert "is not an IMDB .npz file" in capsys.readouterr().err


def test_subprocess_exit_code() -> None:
    p = subprocess.run([sys.executable, "-m", "plait", "bench", "--models", "nope"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown model 'nope'" in p.stderr and "Traceback" not in p.stderr


def test_run_and_check(tiny: BenchModel, tmp_path: Path, capsys: pytest.CaptureFixture[str], thread_env: None) -> None:
    out = tmp_path / "out"
    argv = [
        "bench",
        "--models",
        "tiny",
        "--frameworks",
        "plait,torch,onnxruntime,tinygrad",
        "--device",
        "cpu",
        "--tasks",
        "none",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--threads",
        "1",
        "--no-progress",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    result = json.loads((out / "results.json").read_text())
    assert {c["status"] for c in result["cells"] if c["framework"] != "tinygrad"} <= {"ok", "skipped"}
    assert result["environment"]["thread_env"]["OMP_WAIT_POLICY"] == "PASSIVE"
    pairs = [result["cpu_pair_ns_start"], result["environment"]["host"]["cpu_pair_ns_end"]]
    fma = [result["cpu_pair_fma_start"], result["environment"]["host"]["cpu_pair_fma_end"]]
    if len(os.sched_getaffinity(0)) >= 2:  # the host's placement of two CPUs is part of the record
        assert all(isinstance(ns, float) and ns > 0 for ns in pairs)
        assert all(isinstance(r, float) and r > 0 for r in fma)  # a measured ratio (its value depends on the load)
        assert "CPU pair round trip" in (out / "results.md").read_text()
        assert "multiply-add rate" in (out / "results.md").read_text()
    else:
        assert pairs == [None, None] and fma == [None, None]
    s = result["settings"]
    assert s["torch"]["torch_threads"] == 1 and s["torch"]["tf32"] is False and s["iters"] == 3
    assert result["runners"]["onnxruntime"]["intra_op_num_threads"] == 1
    assert (out / "report.html").read_text().count("data:image/png;base64,") == 3
    assert "| tiny | 1 |" in (out / "results.md").read_text()
    capsys.readouterr()

    reference = tmp_path / "ref.json"
    for c in result["cells"]:
        if c["status"] == "ok":
            c["median_ms"] /= 100  # the reference run was 100x faster: everything regressed
    reference.write_text(json.dumps(result))
    assert main([*argv, "--check", str(reference)]) == 1
    assert "REGRESSION" in capsys.readouterr().out
    assert main([*argv, "--check", str(out / "results.json"), "--threshold", "100"]) == 0


def test_cpu_pair_needs_two_cpus() -> None:
    """With one allowed CPU there is no pair to measure: None, not a number from one CPU playing both sides."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        " from plait.bench.env import cpu_pair_fma, cpu_pair_ns; print(cpu_pair_ns(), cpu_pair_fma())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "None None"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_cpu_pair_fma_two_cpus_against_one() -> None:
    """With two CPUs the probe measures (near 1 on separate cores, near 0.5 when the host shares one core between
    them; the suite's other workers load the CPUs meanwhile, so the value itself is not asserted), and a CPU it
    cannot pin a thread to gives -1 from the C side, never a ratio."""
    from plait.bench.env import _pair_lib, cpu_pair_fma

    ratio = cpu_pair_fma()
    assert isinstance(ratio, float) and ratio > 0
    lib = _pair_lib()
    assert lib is not None and lib.host_pair_fma(0, 1 << 20, 1000) == -1


def test_steal_share_from_cpu_ticks() -> None:
    """The hypervisor's share of the CPUs' time between two /proc/stat readings (bench_onnx.py's "host steal %")."""
    from plait.bench.env import cpu_ticks, steal_share, steal_text

    ticks = cpu_ticks()
    if sys.platform.startswith("linux"):
        assert ticks is not None and 0 <= ticks[0] <= ticks[1]
    assert steal_share((10, 1000), (15, 1100)) == 0.05
    assert steal_share((10, 1000), (10, 1000)) is None  # no ticks between the readings
    assert steal_share(None, (15, 1100)) is None
    assert steal_text((10, 1000), (15, 1100)) == "5.0%" and steal_text(None, None) == "n/a"
