#!/usr/bin/env bash
# The cpu measurements of issue 8 (docs/benchmarks.md "Issue 8 at the end of ..."), on this machine, 2 threads for
# every framework and OMP_WAIT_POLICY=PASSIVE (plait bench sets both), in stages:
#   tools/cpu-issue8.sh infer    # batch 1 and 16 inference, five CNNs: plait twins vs ONNX Runtime and PyTorch
#   tools/cpu-issue8.sh onnx     # the same models exported to ONNX and run through plait.onnx vs ONNX Runtime
#   tools/cpu-issue8.sh train    # batch 16 training step, plait's compiled step vs PyTorch eager
# MODELS (comma-separated) narrows each stage; ITERS and MAX_SECONDS (onnx stage) raise its rounds (default 5, 10 s). Run it on a quiet machine: the load average is printed per stage.
# Results go under ./cpu-results (or $OUT).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${OUT:-cpu-results}
mkdir -p "$out"
export OMP_WAIT_POLICY=PASSIVE
for stage in "$@"; do
  echo "== $stage $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) git $(git rev-parse --short HEAD 2>/dev/null)"
  case $stage in
    infer)
      $py -m plait bench --models "${MODELS:-alexnet,resnet18,resnet50,vgg16,mobilenet_v2}" --modes infer-1,infer-batch \
        --batch 16 --frameworks plait,onnxruntime,torch --device cpu --threads 2 --warmup 1 --iters 5 \
        --max-seconds 10 --tasks none --no-progress --out "$out/infer"
      ;;
    onnx)
      models=()
      [ -n "${MODELS:-}" ] && models=(--models ${MODELS//,/ })
      PLAIT_NUM_THREADS=2 $py benchmarks/bench_onnx.py --twins --iters "${ITERS:-5}" --max-seconds "${MAX_SECONDS:-10}" "${models[@]}"
      ;;
    train)
      $py -m plait bench --models "${MODELS:-cifar_cnn,gru,resnet18,mobilenet_v2}" --modes train --batch 16 \
        --frameworks plait,torch --device cpu --threads 2 --iters 5 --max-seconds 10 --tasks none --no-progress \
        --out "$out/train"
      ;;
    *)
      echo "unknown stage $stage (infer, onnx, train)" >&2
      exit 2
      ;;
  esac
done
