#!/usr/bin/env bash
# One device call (for a session with little device time): the MoE GPU tests (tests/gpu/moe_test.cc),
# then myriad bench on configs/bench-olmoe-8l.toml and bench/torch_moe.py's olmoe-8l preset side by side
# (B 8 on an H200; B 4, or 2 if that does not fit, on an 80 GB card), inside TOTAL_S seconds.
# Stage into D (default .device-moe, ignored): scripts/stage_device.sh's stage.tgz, scripts/device_env.sh,
# configs/bench-olmoe-8l.toml, torch_moe.py; carry D; run `bash scripts/gpu_moe_session.sh` (or a copy as D/run.sh where the checkout lacks it).
set -uo pipefail
cd "$(dirname "$0")/.."
M=/tmp/m; mkdir -p $M && tar xzf ${D:-.device-moe}/stage.tgz -C $M
source ${D:-.device-moe}/device_env.sh
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
timeout ${TEST_S:-120} $M/bin/test_gpu --gtest_filter="${FILTER:-*Moe*}" > "$OUT/moe_tests.log" 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s" | tee -a "$OUT/moe_tests.log"
grep -E "^\s+(route|router|gather|grouped|moe|first update)|FAILED|PASSED|Failure|Expected|Which is|error|warn|rel|GPU_TEST_SEED" "$OUT/moe_tests.log" | head -120
[ -n "${NOBENCH:-}" ] && exit 0
B=8; [ "$mem" -lt 100000 ] && B=4
for b in $B 2; do
  left=$(( ${TOTAL_S:-560} - ($(date +%s) - start) )); [ $left -lt 40 ] && break
  timeout $(( left < 200 ? left : 200 )) $M/bin/myriad bench --config ${D:-.device-moe}/bench-olmoe-8l.toml --set train.global_batch=$b \
    --set train.micro_batch=$b --steps ${STEPS:-10} --warmup ${WARMUP:-5} > "$OUT/myriad_bench.json" 2> "$OUT/myriad_bench.err"
  rc=$?; echo "myriad bench B=$b rc=$rc after $(( $(date +%s) - start )) s"; cat "$OUT/myriad_bench.json"; tail -3 "$OUT/myriad_bench.err"
  [ $rc -eq 0 ] && break
  grep -q "does not fit\|out of memory" "$OUT/myriad_bench.err" || break  # retry smaller only for memory
done
left=$(( ${TOTAL_S:-560} - ($(date +%s) - start) )); [ $left -lt 80 ] && { echo "no time left for torch ($left s)"; exit 0; }
timeout $left python3 ${D:-.device-moe}/torch_moe.py --preset olmoe-8l --batch $b --steps 10 --warmup 5 > "$OUT/torch_bench.json" 2> "$OUT/torch_bench.err"
echo "torch B=$b rc=$? after $(( $(date +%s) - start )) s"; cat "$OUT/torch_bench.json"; tail -3 "$OUT/torch_bench.err"
