#!/usr/bin/env bash
# Creates .venv and installs plait with what the tests and benchmarks need; installs Debian's PoCL (an OpenCL
# driver for the CPU) when run as root and no working OpenCL CPU device exists. Safe to run again: it skips work
# that is already done (a stamp file records the inputs it installed from).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP="$VENV/.plait-setup-$(cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  "$PY" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ]; then
  echo "setup: installing plait and its test/benchmark dependencies into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  # torch 2.13.0: the small CPU wheel (a newer or unpinned torch would pull a multi-GB CUDA build)
  "$VENV/bin/python" -m pip install -q -e ".[dev]" "torch==2.13.0" onnx onnxruntime matplotlib 2>&1 | grep -v -E "^WARNING: Location|ignored: it is neither" || true
  "$VENV/bin/python" -c "import plait, torch, onnx, onnxruntime" >/dev/null
  rm -f "$VENV"/.plait-setup-*
  touch "$STAMP"
fi

# OpenCL on the CPU: PoCL from Debian, when we can install it and no working device exists.
if ! "$VENV/bin/python" -c "
import sys
from plait.runtime.opencl import discover
sys.exit(0 if any(why is None for _, _, why in discover()) else 1)" 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: no working OpenCL device; installing Debian's pocl-opencl-icd"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q pocl-opencl-icd >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q pocl-opencl-icd >/dev/null; }
  else
    echo "setup: no working OpenCL device and not root: OpenCL tests will be skipped (install pocl-opencl-icd)"
  fi
fi
