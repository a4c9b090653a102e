#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu_check.sh unpacked the build into /tmp/m: Llama 3.2 1B with
# long sequences on the one GPU, the cp ranks sharing it through Gloo with host staging (so the
# step times are not what NCCL between GPUs gives; the memory per rank is what this measures):
#   - loss parity: cp 2 against one process at 8K (every step's loss within 1%);
#   - each rank's peak memory at 16K with cp 1, 2 and 4 (activations fall as 1/cp; ZeRO's
#     shards of the optimizer state over cp too);
#   - 32K with cp 2 (parallel.overlap_cp on and off) and 64K with cp 4: the step time and each
#     rank's peak memory;
#   - 16K with cp 2 on cuDNN and on Myriad's kernel (c16k): the step times.
# Full recompute, one sequence per step, byte tokens of the snapshot corpus (repeated). ONLY
# names the runs to make by their prefixes (p8k, l32k, l64k, m16k, c16k; all when unset): an H100's
# 80 GB holds the 8K and 16K runs and 32K cp 2, not 64K cp 4's four ranks.
#   STEPS=4 ONLY="p8k m16k" bench/cp_long_context.sh
set -uo pipefail
cd "$(dirname "$0")/.."
M=/tmp/m
B=$M/bin/myriad
source scripts/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
for i in 1 2 3 4 5 6 7 8; do cat tests/gpu/corpus/*.txt; done > "$W/c.txt"
$B prepare --input "$W/c.txt" --tokenizer byte --output "$W/d" >/dev/null 2>&1
STEPS=${STEPS:-4}
args=(train --config configs/llama-3.2-1b.toml --set data.train="$W/d" --set data.valid= --set data.tokenizer=byte
      --set train.device=cuda --set train.micro_batch=1 --set train.global_batch=1 --set train.recompute=full
      --set train.steps=$STEPS --set train.log_every=1 --set train.eval_every=0 --set checkpoint.every=0
      --set optim.warmup_steps=2 --set optim.lr=1e-4)
fail=0
selected() { [ -z "${ONLY:-}" ] && return 0; local p; for p in $ONLY; do [[ $1 == "$p"* ]] && return 0; done; return 1; }
run() {  # NAME NPROC SEQ [--set ...]
  local rd=$1 n=$2 T=$3; shift 3
  selected "$rd" || return 0
  local t0=$(date +%s)
  $B launch --nproc-per-node "$n" -- "${args[@]}" --set model.seq_len=$T --set parallel.cp=$n \
    --run-dir "$W/$rd" "$@" >"$W/$rd.log" 2>&1 || { echo "FAIL: $rd (exit $?)"; tail -5 "$W/$rd.log"; fail=1; }
  rm -rf "$W/$rd/checkpoints"  # the final save of a 1.24B model and its moments: 15 GB a run, 64 GB of disk
  python3 - "$rd" "$n" "$T" "$W/$rd/metrics.jsonl" "$(( $(date +%s) - t0 ))" <<'PY' | tee -a "$OUT/cp_long_context.txt"
import json, statistics, sys
rd, n, T, path, wall = sys.argv[1:]
try: r = [json.loads(l) for l in open(path)]
except OSError: r = []
if not r: print(f"{rd}: no steps"); sys.exit(0)
ms = statistics.median(x["step_ms"] for x in r[1:]) if len(r) > 1 else r[0]["step_ms"]
mem = max(x.get("peak_memory_gib", 0) for x in r)
print(f"{rd}: seq {T} cp {n}: {len(r)} steps, median step {ms:.0f} ms ({int(T) / ms * 1000:.0f} tok/s on the GPU), "
      f"peak memory {mem:.2f} GiB per rank, losses {' '.join('%.4f' % x['loss'] for x in r)} ({wall} s)")
PY
}
# Both on Myriad's attention kernel (cp 1 would take cuDNN's), at a rate that stays clear of the
# early loss spikes on which bf16 trajectories part: on 2026-12-06 at lr 1e-4 with cuDNN for cp 1,
# steps 1 and 2 agreed within 0.2% and step 3 parted by 11%, cp 1's loss rising where cp 2's fell.
run p8k_cp1 1 8192 --set train.attention=myriad --set optim.lr=1e-5 --set optim.min_lr=1e-6
run p8k_cp2 2 8192 --set train.attention=myriad --set optim.lr=1e-5 --set optim.min_lr=1e-6
selected p8k && { python3 - "$W/p8k_cp2/metrics.jsonl" "$W/p8k_cp1/metrics.jsonl" <<'PY' || fail=1; }
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(f)] for f in sys.argv[1:])
worst = max(abs(x - y) / y for x, y in zip(a, b)) if a and len(a) == len(b) else 1
print(f"{'ok' if worst < 0.01 else 'FAIL'}: 8K cp 2 against one process: losses within {worst:.3%}")
sys.exit(0 if worst < 0.01 else 1)
PY
run l32k_cp2 2 32768
run l64k_cp4 4 65536
# All three on Myriad's kernel: cp 1 would take cuDNN, whose deterministic backward's workspace
# (B H T T bf16, 16 GiB here) would hide the activations' fall.
run m16k_cp1 1 16384 --set train.attention=myriad
run m16k_cp4 4 16384
run m16k_cp2 2 16384
run l32k_cp2_no_overlap 2 32768 --set parallel.overlap_cp=false
# cuDNN under cp (one call a chunk) against Myriad's kernel, both not deterministic (cuDNN's
# deterministic backward would hold B H x 4K x 16K bf16 of workspace here: 4 GiB).
run c16k_cp2_myriad 2 16384 --set train.attention=myriad --set train.deterministic=false
run c16k_cp2_cudnn 2 16384 --set train.attention=cudnn --set train.deterministic=false
[ "$fail" = 0 ] || cp "$W"/*.log "$OUT/" 2>/dev/null
rm -rf "$W"
exit $fail
