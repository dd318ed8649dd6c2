#!/usr/bin/env bash
# The GPU measurements of issue 8 (docs/benchmarks.md "NVIDIA GPU: side by side with PyTorch"), run on the device
# machine through tools/gpu-run.sh, in stages so that each fits one device call:
#   tools/gpu-run.sh tools/gpu-issue8.sh tests    # the OpenCL-specific tests on the GPU
#   tools/gpu-run.sh tools/gpu-issue8.sh infer    # batch 1 and 64 inference, five CNNs, plait vs PyTorch+cuDNN
#   tools/gpu-run.sh tools/gpu-issue8.sh train    # batch 64 training step, plait vs PyTorch+cuDNN
# MODELS (comma-separated) narrows the infer and train stages.
# Results go under $OUT (the device tool's output folder) or ./gpu-results.
set -uo pipefail
out=${OUT:-gpu-results}
mkdir -p "$out"
common=(--frameworks plait,torch --device opencl:0 --torch-device cuda --batch 64 --cudnn-benchmark --tasks none
  --no-progress)
for stage in "$@"; do
  echo "== $stage $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  case $stage in
    tests)
      PLAIT_TEST_DEVICES=opencl:0 python3 -m pytest -q -n 8 -o addopts="" -p no:cacheprovider \
        tests/ops/test_gemm_tc.py tests/ops/test_gemm_conv_cl.py tests/ops/test_winograd_cl.py \
        tests/ops/test_depthwise_cl.py tests/ops/test_split_k_linear_cl.py tests/ops/test_plan_constants.py \
        tests/ops/test_backward_split.py tests/ops/test_tune_model.py tests/nn/test_compile_step.py \
        tests/nn/test_conv_training.py tests/nn/test_jit_retrace.py tests/nn/test_merged_update.py \
        tests/ops/test_bn_recompute_cl.py tests/ops/test_conv_gather_train_cl.py tests/ops/test_depthwise_grad_cl.py \
        tests/ops/test_reduce_one_stage.py tests/ops/test_wgrad_nchw_cl.py tests/ops/test_wgrad_split_cl.py \
        tests/ops/test_pool_grad_cl.py tests/nn/test_linear_grad_cl.py tests/ops/test_reduce_rows_cl.py \
        tests/ops/test_gemm_vector_gather_cl.py tests/ops/test_gemm_step_rules_cl.py tests/ops/test_winograd_wgrad_cl.py \
        tests/ops/test_relu_pool_grad_cl.py tests/ops/test_step_views_cl.py tests/ops/test_gemm_ks_rules_cl.py \
        tests/ops/test_chunk_sum_inline_cl.py tests/nn/test_cross_entropy_cl.py tests/nn/test_backward_loss.py \
        tests/ops/test_winograd5_cl.py tests/unit/test_winograd_f25.py tests/ops/test_winograd43_cl.py \
        tests/ops/test_opencl_build.py \
        2>&1 | tail -15
      echo "pytest exit status ${PIPESTATUS[0]}"
      ;;
    infer)
      python3 -m plait bench --models "${MODELS:-alexnet,resnet18,resnet50,vgg16,mobilenet_v2}" --modes infer-1,infer-batch \
        --iters 10 --out "$out/infer" "${common[@]}"
      ;;
    train)
      python3 -m plait bench --models "${MODELS:-alexnet,resnet18,resnet50,vgg16,mobilenet_v2,cifar_cnn,gru}" --modes train \
        --iters 5 --max-seconds 5 --out "$out/train" "${common[@]}"
      ;;
    *)
      echo "unknown stage $stage (tests, infer, train)" >&2
      exit 2
      ;;
  esac
done
