"""Thread settings and the record of everything in the environment that changes a benchmark result.

`set_threads` must run before torch or onnxruntime is imported: OpenMP reads OMP_NUM_THREADS and OMP_WAIT_POLICY
once, and without PASSIVE waiting PyTorch's idle threads spin and steal the cores the other frameworks need.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from typing import Any


def set_threads(n: int) -> dict[str, str]:
    """Give every framework the same `n` threads (and passive OpenMP waiting); returns the variables set."""
    env = {
        "OMP_NUM_THREADS": str(n),
        "MKL_NUM_THREADS": str(n),
        "OPENBLAS_NUM_THREADS": str(n),
        "OMP_WAIT_POLICY": "PASSIVE",
        "PLAIT_NUM_THREADS": str(n),
    }
    os.environ.update(env)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    return env


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _git_commit() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def load_average() -> list[float]:
    """The 1/5/15-minute load average: other work on the machine skews every timing, so it goes in the record."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def environment(threads: int, plait_devices: list[str]) -> dict[str, Any]:
    """Versions, host, devices and drivers, thread variables: what a reader needs to reproduce the numbers."""
    import numpy as np

    import plait
    from plait.runtime import get_device

    versions: dict[str, str] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "plait": plait.__version__,
    }
    for mod in ("torch", "onnx", "onnxruntime", "tinygrad", "tensorflow", "matplotlib"):
        if mod in sys.modules:
            versions[mod] = str(getattr(sys.modules[mod], "__version__", "?"))
    devices = {}
    for name in plait_devices:
        info = get_device(name).info
        devices[name] = {
            "kind": info.kind,
            "name": info.name,
            "driver": info.driver,
            "compute_units": info.compute_units,
            "memory_gib": round(info.memory_bytes / 2**30, 1),
        }
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "host": {
            "platform": platform.platform(),
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "nvidia": _nvidia_driver(),
            "load_average_end": load_average(),
        },
        "git_commit": _git_commit(),
        "versions": versions,
        "plait_devices": devices,
        "threads": threads,
        "thread_env": {
            k: os.environ.get(k, "")
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "PLAIT_NUM_THREADS")
        },
    }


def torch_settings(torch: Any, tf32: bool, cudnn_benchmark: bool) -> dict[str, Any]:
    """Apply and record the PyTorch switches that change speed or numerics."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = cudnn_benchmark
    cuda = torch.cuda.is_available()
    return {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "tf32": tf32,
        "cudnn_benchmark": cudnn_benchmark,
        "cuda": torch.version.cuda if cuda else None,
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
    }
