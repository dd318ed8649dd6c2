#!/usr/bin/env bash
# Run on the GPU machine from the repository root: installs the carried wheels (.whl/, made by
# tools/fetch-gpu-wheels.sh) into a scratch folder, makes NVIDIA's OpenCL visible to pyopencl, then runs "$@".
#   tools/gpu-run.sh python3 -m pytest tests -q
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${SCRATCH:-/tmp}/plait-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl
# plait itself, so its entry points (the torch.compile backend "plait") are registered
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$SITE" . >/dev/null
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
# shellcheck source=tools/nvidia-opencl-env.sh
source tools/nvidia-opencl-env.sh
export PLAIT_CACHE_DIR=${PLAIT_CACHE_DIR:-/tmp/plait-cache}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
exec "$@"
