#!/usr/bin/env bash
# One device call's worth of GPU work, for a session with little device time: the GPU tests,
# then the side-by-side benchmarks named in BENCH, each under its own time limit, results
# written to $OUT as they come (a call cut off at its limit still returns what was done).
#   TEST_S=150 BENCH_S=180 BENCH="gpt-1.3b-pw gpt-2.7b" scripts/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
timeout "${TEST_S:-150}" bash scripts/gpu_check.sh > "$OUT/check.txt" 2>&1
echo "gpu_check rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/check.txt"
tail -20 "$OUT/check.txt"
for name in ${BENCH:-}; do
  OUT=/tmp/bench timeout "${BENCH_S:-180}" bash bench/gpu_vs_torch.sh "$name" 2>&1 | tee -a "$OUT/bench.txt"
  cat /tmp/bench/bench_gpu.jsonl > "$OUT/bench_gpu.jsonl" 2>/dev/null
  tail -n 5 /tmp/bench/*.err > "$OUT/bench_err.txt" 2>/dev/null
  echo "$name done after $(( $(date +%s) - start )) s" | tee -a "$OUT/bench.txt"
done
# The device call returns only a few files: everything in one archive, beside the summary.
( cd "$OUT" && tar czf /tmp/session_logs.tgz --exclude=logs.tgz . && find . -type f ! -name check.txt ! -name bench.txt -delete \
  && find . -mindepth 1 -type d -empty -delete && mv /tmp/session_logs.tgz logs.tgz )
