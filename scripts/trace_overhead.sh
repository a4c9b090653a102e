#!/usr/bin/env bash
# The cost of observe.trace: the same run alternately without and with tracing, REPEAT times
# each, and the medians of their median step times (docs/PERFORMANCE.md).
#   REPEAT=5 scripts/trace_overhead.sh [MYRIAD] [-- extra --set flags]
# CPU: the demo model, 8 processes (tp 2 x pp 2 x dp 2) through the launcher. With
# BENCH_CONFIG=configs/gpt-1.3b.toml (a GPU machine): `myriad bench` of that config instead.
set -uo pipefail
cd "$(dirname "$0")/.."
B=$(realpath "${1:-build/myriad}"); shift $(( $# > 0 ? 1 : 0 ))
[ "${1:-}" = "--" ] && shift
REPEAT=${REPEAT:-5}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
once() {  # TRACE [extra flags] -> the run's median step time in ms
  local trace=$1; shift
  if [ -n "${BENCH_CONFIG:-}" ]; then
    "$B" bench --config "$BENCH_CONFIG" --set observe.trace="$trace" "$@" --steps 10 --warmup 3 2>/dev/null | tail -1 |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["step_ms_median"])'
    return
  fi
  rm -rf "$W/run"
  OMP_NUM_THREADS=1 "$B" launch --nproc-per-node 8 -- train --config configs/demo.toml --run-dir "$W/run" \
    --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 --set train.steps=60 --set train.eval_every=0 \
    --set checkpoint.every=0 --set data.train="$W/d" --set data.valid= --set observe.trace="$trace" "$@" >/dev/null 2>&1
  python3 -c 'import json,statistics,sys; r=[json.loads(l) for l in open(sys.argv[1])][10:]; print(statistics.median(x["step_ms"] for x in r))' "$W/run/metrics.jsonl"
}
[ -n "${BENCH_CONFIG:-}" ] || "$B" prepare --input README.md --input docs/ARCHITECTURE.md --tokenizer byte --output "$W/d" >/dev/null 2>&1
off=(); on=()
for i in $(seq "$REPEAT"); do off+=("$(once false "$@")"); on+=("$(once true "$@")"); done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
off = [float(x) for x in sys.argv[1].split()]; on = [float(x) for x in sys.argv[2].split()]
a, b = statistics.median(off), statistics.median(on)
print(f"trace off: {a:.2f} ms/step (runs {off}); on: {b:.2f} ms/step (runs {on}); overhead {100 * (b / a - 1):+.1f}%")
PY
