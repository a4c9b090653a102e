#!/usr/bin/env bash
# Recovery, `myriad launch --max-restarts` (CPU processes, 2 workers, the demo model in dp 2,
# checkpoints every 4 steps), read from RUN_DIR/driver/events.jsonl, REPEAT times (default 5),
# then the median:
#   kill   rank 1 killed after step 6: seconds from the fault event to the first step the
#          restarted attempt completes (stop and check included)
#   hang   rank 1 stopped (SIGSTOP) after step 6, comm.timeout_s 300: seconds from its last
#          heartbeat to its detection (the fault event's "no heartbeat for N s"), and from its
#          last heartbeat to the first step after the restart
#   scripts/restart_bench.sh [kill|hang] [MYRIAD_BINARY]
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-kill}
B=${2:-build/myriad}
[ -d "$(dirname "$B")/../lib" ] && export LD_LIBRARY_PATH="$(dirname "$B")/../lib:${LD_LIBRARY_PATH:-}"
W=$(mktemp -d)
"$B" prepare --input README.md --input docs/ARCHITECTURE.md --input docs/CONFIG.md --tokenizer byte --output "$W/d" >/dev/null 2>&1
for i in $(seq 1 "${REPEAT:-5}"); do
  rm -rf "$W/run"
  OMP_NUM_THREADS=1 MYRIAD_INJECT_FAULT=step:6:$MODE@rank=1 "$B" launch --nproc-per-node 2 --max-restarts 2 -- \
    train --config configs/demo.toml --run-dir "$W/run" --set parallel.dp=2 --set train.device=cpu \
    --set train.steps=8 --set checkpoint.every=4 --set train.log_every=1 --set train.eval_every=0 \
    --set comm.timeout_s=300 --set data.train="$W/d" --set data.valid= >"$W/out" 2>&1 || { tail -5 "$W/out"; exit 1; }
  python3 - "$W/run/driver/events.jsonl" "$MODE" <<'PY' | tee -a "$W/times"
import json, re, sys
t, detail = {}, ""
for line in open(sys.argv[1]):
    e = json.loads(line); t.setdefault(e["event"], e["time"])
    if e["event"] == "fault": detail = e.get("detail", "")
back = t["resumed"] - t["fault"]
if sys.argv[2] == "hang":
    found = float(re.search(r"no heartbeat for ([0-9.]+) s", detail).group(1))
    print("%.2f %.2f" % (found, found + back))
else:
    print("%.2f" % back)
PY
done
python3 - "$W/times" "$MODE" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
if sys.argv[2] == "hang":
    print("myriad hang (SIGSTOP): detected %.1f s after its last heartbeat, training again %.1f s after it (medians of %d)"
          % (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows), len(rows)))
else:
    print("myriad crash (SIGKILL): training again %.2f s after the fault (median of %d)"
          % (statistics.median(r[0] for r in rows), len(rows)))
PY
rm -rf "$W"
