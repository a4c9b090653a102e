#!/usr/bin/env bash
# Recovery from a killed worker, `myriad launch --max-restarts` (CPU processes, 2 workers, the
# demo model in dp 2, checkpoints every 4 steps): seconds from the fault to the first step the
# restarted attempt completes, read from RUN_DIR/driver/events.jsonl. Runs REPEAT times.
#   scripts/restart_bench.sh [MYRIAD_BINARY]
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build/myriad}
[ -d "$(dirname "$B")/../lib" ] && export LD_LIBRARY_PATH="$(dirname "$B")/../lib:${LD_LIBRARY_PATH:-}"
W=$(mktemp -d)
"$B" prepare --input README.md --input docs/ARCHITECTURE.md --input docs/CONFIG.md --tokenizer byte --output "$W/d" >/dev/null 2>&1
for i in $(seq 1 "${REPEAT:-3}"); do
  rm -rf "$W/run"
  OMP_NUM_THREADS=1 MYRIAD_INJECT_FAULT=step:6:kill@rank=1 "$B" launch --nproc-per-node 2 --max-restarts 2 -- \
    train --config configs/demo.toml --run-dir "$W/run" --set parallel.dp=2 --set train.device=cpu \
    --set train.steps=8 --set checkpoint.every=4 --set train.log_every=1 --set train.eval_every=0 \
    --set data.train="$W/d" --set data.valid= >"$W/out" 2>&1 || { tail -5 "$W/out"; exit 1; }
  python3 - "$W/run/driver/events.jsonl" <<'PY'
import json, sys
t = {}
for line in open(sys.argv[1]):
    e = json.loads(line); t.setdefault(e["event"], e["time"])
print("myriad crash: first step after restart %.2f s after the fault" % (t["resumed"] - t["fault"]))
PY
done
rm -rf "$W"
