#!/usr/bin/env bash
# On a GPU machine: unpack what scripts/stage_device.sh packed and run the GPU tests, then any
# extra command given. Results go to $OUT when set.
#   scripts/gpu_check.sh [--gtest_filter=...]
set -uo pipefail
cd "$(dirname "$0")/.."
M=/tmp/m
mkdir -p $M && tar xzf .device/stage.tgz -C $M
source scripts/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv,noheader
$M/bin/test_gpu "$@" 2>&1 | tee "$OUT/test_gpu.log" | grep -vE "^\[ +(RUN|OK) +\]" | tail -60
bash scripts/gpu_launch_check.sh 2>&1 | tee "$OUT/launch_check.txt"
bash scripts/gpu_layouts_check.sh 2>&1 | tee "$OUT/layouts_check.txt"
bash scripts/gpu_hf_check.sh 2>&1 | tee "$OUT/hf_check.txt"
