#!/usr/bin/env bash
# Downloads, on this machine, the wheels the GPU machine lacks (its Python is 3.12) into .whl/ (git-ignored),
# for tools/gpu-run.sh to install there. Needs network access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl pyopencl pytools platformdirs siphash24 "$@" 2>&1 | grep -v "^WARNING" || true
ls -1 .whl
