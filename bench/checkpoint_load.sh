#!/usr/bin/env bash
# Resuming with one reader per data-parallel group (checkpoint.load = broadcast) against every
# rank reading (all), on the CPU: NPROC processes of data parallelism save a checkpoint once, then
# each way resumes from it twice (the second with the files in the page cache); the figure is
# the slowest rank's load time, from the ranks' "resume: ... in X s" lines.
#   NPROC=8 bench/checkpoint_load.sh configs/gpt2-124m.toml --set model.seq_len=64
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: bench/checkpoint_load.sh CONFIG [--set key=value]...}
shift
B=${MYRIAD:-build/myriad}
N=${NPROC:-8}
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
[ -f "$W/d.idx" ] || "$B" prepare --input README.md --input docs/ARCHITECTURE.md --tokenizer byte --output "$W/d" >/dev/null
common=(--set data.train="$W/d" --set data.valid= --set data.tokenizer=byte --set train.device=cpu
        --set parallel.dp="$N" --set train.global_batch="$N" --set train.micro_batch=1 --set train.eval_every=0
        --set observe.tensorboard=false --set train.steps=1 "$@")
rm -rf "$W/run"
OMP_NUM_THREADS=1 "$B" launch --nproc-per-node "$N" -- train --config "$CONFIG" --run-dir "$W/run" "${common[@]}" \
  > "$W/save.txt" 2>&1 || { tail -5 "$W/save.txt"; exit 1; }
echo "checkpoint: $(du -sh "$W/run/checkpoints/step_00000001" | cut -f1)"
for how in all broadcast all broadcast; do
  rm -rf "$W/run/logs"
  OMP_NUM_THREADS=1 "$B" launch --nproc-per-node "$N" -- train --config "$CONFIG" --run-dir "$W/run" "${common[@]}" \
    --resume auto --set checkpoint.load=$how > "$W/load.txt" 2>&1 || { tail -5 "$W/load.txt"; exit 1; }
  # Every rank's log holds its own load time.
  slowest=$(grep -ho "samples consumed) in [0-9.]* s" "$W"/run/logs/rank_*.log 2>/dev/null | awk '{print $4}' | sort -g | tail -1)
  echo "{\"load\": \"$how\", \"ranks\": $N, \"slowest_rank_s\": ${slowest:-null}}"
done
