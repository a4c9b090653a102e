#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu_check.sh unpacked the build into /tmp/m: is cp 2's parting
# from one process at 8K (docs/notes/cp.md, "The 8K parity") cp's own, or what any change of
# arithmetic order does to these early, sign-like Adam steps? A 4-layer model of Llama 3.2 1B's
# width (vocab 512: byte tokens), 8K tokens a sequence, full recompute, 8 steps at lr 1e-4, each
# run's losses and gradient norms printed side by side:
#   one_b1 / cp2_b1          one sequence a step: one process against cp 2 (Myriad's kernel both)
#   one_b1_cudnn             one process on cuDNN's attention: the spread another kernel gives
#   one_b2 / dp2_b2          two sequences a step: one process against ZeRO over dp 2
#   bench/cp_parity_bisect.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
B=/tmp/m/bin/myriad
W=$(mktemp -d)
for i in 1 2 3 4 5 6 7 8; do cat tests/gpu/corpus/*.txt; done > "$W/c.txt"
$B prepare --input "$W/c.txt" --tokenizer byte --output "$W/d" >/dev/null 2>&1
args=(train --config configs/llama-3.2-1b.toml --set data.train="$W/d" --set data.valid= --set data.tokenizer=byte
      --set model.layers=4 --set model.vocab_size=512 --set model.seq_len=8192 --set train.attention=myriad
      --set train.device=cuda --set train.micro_batch=1 --set train.recompute=full
      --set train.steps=8 --set train.log_every=1 --set train.eval_every=0 --set checkpoint.every=0
      --set optim.warmup_steps=2 --set optim.lr=1e-4)
run() {  # NAME NPROC [--set ...]
  local rd=$1 n=$2; shift 2
  $B launch --nproc-per-node "$n" -- "${args[@]}" --run-dir "$W/$rd" "$@" >"$W/$rd.log" 2>&1 ||
    { echo "FAIL: $rd"; tail -3 "$W/$rd.log"; }
  rm -rf "$W/$rd/checkpoints"
  python3 - "$rd" "$W/$rd/metrics.jsonl" <<'PY'
import json, sys
try: r = [json.loads(l) for l in open(sys.argv[2])]
except OSError: r = []
print(f"{sys.argv[1]:>14}: " + " ".join(f"{x['loss']:.4f}/{x['grad_norm']:.2f}" for x in r))
PY
}
run one_b1 1 --set train.global_batch=1
run cp2_b1 2 --set train.global_batch=1 --set parallel.cp=2
run one_b1_cudnn 1 --set train.global_batch=1 --set train.attention=cudnn
run one_b2 1 --set train.global_batch=2
run dp2_b2 2 --set train.global_batch=2 --set parallel.dp=2
rm -rf "$W"
