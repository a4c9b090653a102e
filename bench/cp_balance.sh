#!/usr/bin/env bash
# How even context parallelism's attention work is with packed documents (the cp_imbalance of
# each step's record: the busiest rank's (query, key) pairs over the mean), on the CPU through the
# launcher: the science fortunes (625 documents of about 205 bytes), byte tokens, one sequence a
# step, 16 steps, a one-layer model (the figure depends on the documents and the chunks' pairing,
# not on the model). Prints the median and the largest over the steps per (seq_len, cp).
#   bench/cp_balance.sh [SEQ_LENS] [CPS]     e.g. bench/cp_balance.sh "2048 8192" "2 4 8"
set -euo pipefail
cd "$(dirname "$0")/.."
B=${MYRIAD:-build/myriad}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
src=/usr/share/games/fortunes/science
[ -f "$src" ] || { echo "cp_balance: $src not found (Debian's fortunes-min package holds it)" >&2; exit 2; }
for i in $(seq 8); do cat "$src"; done > "$W/c.txt"
$B prepare --input "$W/c.txt" --tokenizer byte --doc-separator % --output "$W/d" >/dev/null
for T in ${1:-2048 8192}; do
  for cp in ${2:-2 4 8}; do
    $B launch --nproc-per-node "$cp" -- train --config configs/demo.toml --set data.train="$W/d" --set data.valid= \
      --set model.layers=1 --set model.d_model=64 --set model.heads=1 --set model.seq_len="$T" \
      --set data.document_mask=true --set parallel.cp="$cp" --set train.global_batch=1 --set train.micro_batch=1 \
      --set train.steps=16 --set train.log_every=1 --set train.eval_every=0 --set checkpoint.every=0 \
      --run-dir "$W/r${T}_$cp" >"$W/r${T}_$cp.log" 2>&1 || { echo "FAIL: seq $T cp $cp"; tail -3 "$W/r${T}_$cp.log"; exit 1; }
    python3 - "$T" "$cp" "$W/r${T}_$cp/metrics.jsonl" <<'PY'
import json, statistics, sys
T, cp, path = sys.argv[1:]
x = [json.loads(l)["cp_imbalance"] for l in open(path) if "cp_imbalance" in l]
print(f"seq {T} cp {cp}: cp_imbalance median {statistics.median(x):.2f}, max {max(x):.2f} over {len(x)} steps")
PY
  done
done
