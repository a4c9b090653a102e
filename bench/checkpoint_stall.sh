#!/usr/bin/env bash
# What a checkpoint costs the step, synchronous against asynchronous (checkpoint.async), in one
# call: the same model and data twice, a save at step 3 (and the last step's, 4); the stall is
# metrics.jsonl's checkpoint_stall_ms of step 3 (that step's time less the median step's).
#   bench/checkpoint_stall.sh CONFIG [--set key=value]...
#   MYRIAD=build/myriad WORK=/tmp/stall bench/checkpoint_stall.sh configs/gpt2-124m.toml \
#     --set train.device=cpu --set train.global_batch=1 --set train.micro_batch=1 --set model.seq_len=64
# Prints one JSON line per mode, then the ratio; the state's bytes are the checkpoint's.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: bench/checkpoint_stall.sh CONFIG [--set key=value]...}
shift
B=${MYRIAD:-build/myriad}
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
# Byte tokens from the project's own text: the data does not matter, the state's size does.
[ -f "$W/d.idx" ] || "$B" prepare --input README.md --input docs/ARCHITECTURE.md --tokenizer byte --output "$W/d" >/dev/null
for mode in false true; do
  rd="$W/run_$mode"
  rm -rf "$rd"
  "$B" train --config "$CONFIG" --run-dir "$rd" --set data.train="$W/d" --set data.valid= --set data.tokenizer=byte \
    --set train.steps=4 --set checkpoint.every=3 --set checkpoint.keep_last=1 --set train.eval_every=0 \
    --set train.log_every=1 --set observe.tensorboard=false --set checkpoint.async=$mode "$@" > "$W/log_$mode.txt" 2>&1 ||
    { tail -5 "$W/log_$mode.txt"; exit 1; }
  bytes=$(du -sb "$rd/checkpoints/step_00000004" | cut -f1)
  /usr/bin/python3 - "$rd/metrics.jsonl" "$mode" "$bytes" <<'EOF'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])]
s3 = next(r for r in m if r["step"] == 3)
print(json.dumps({"async": sys.argv[2] == "true", "checkpoint_bytes": int(sys.argv[3]),
                  "checkpoint_stall_ms": round(s3["checkpoint_stall_ms"], 1),
                  "median_step_ms": round(statistics.median(r["step_ms"] for r in m), 1)}))
EOF
  rm -rf "$rd"
done | tee "$W/stall.jsonl"
/usr/bin/python3 - "$W/stall.jsonl" <<'EOF'
import json, sys
r = {j["async"]: j for j in map(json.loads, open(sys.argv[1]))}
print(f"async stall / sync stall = {r[True]['checkpoint_stall_ms']:.1f} / {r[False]['checkpoint_stall_ms']:.1f} ms"
      f" = {r[True]['checkpoint_stall_ms'] / r[False]['checkpoint_stall_ms']:.3f}")
EOF
