#!/usr/bin/env bash
# On a GPU machine: unpack what scripts/stage_device.sh packed and run the GPU tests, then any
# extra command given. Results go to $OUT when set. Exits nonzero when test_gpu or any check
# failed (a check's "FAIL" line counts), so a caller can trust the code, not only read the lines.
#   scripts/gpu_check.sh [--gtest_filter=...]
set -uo pipefail
cd "$(dirname "$0")/.."
M=/tmp/m
mkdir -p $M && tar xzf .device/stage.tgz -C $M
source scripts/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv,noheader
failed=0
$M/bin/test_gpu "$@" 2>&1 | tee "$OUT/test_gpu.log" | grep -vE "^\[ +(RUN|OK) +\]" | tail -60
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=1
for check in launch layouts cp hf; do
  bash scripts/gpu_${check}_check.sh 2>&1 | tee "$OUT/${check}_check.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] && ! grep -q "FAIL" "$OUT/${check}_check.txt" || failed=1
done
[ $failed -eq 0 ] || echo "gpu_check: something failed (test_gpu, or a FAIL line above)"
exit $failed
