#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu_check.sh unpacked the build into /tmp/m: multi-process
# runs on the one GPU, through the launcher, checked by their exit code and one-line message.
#   - comm.backend = nccl with two ranks sharing the GPU: refused (exit 2), naming both ranks;
#   - comm.backend = auto: Gloo with host staging, said in the log.
# Prints one line per check ("ok: ..." or "FAIL: ...") and exits nonzero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
B=/tmp/m/bin/myriad
source scripts/device_env.sh  # the packed libraries and cuDNN
W=$(mktemp -d)
$B prepare --input README.md --input docs/ARCHITECTURE.md --tokenizer byte --output "$W/d" >/dev/null 2>&1
args=(train --config configs/demo.toml --set data.train="$W/d" --set data.valid= --set train.steps=2
      --set model.layers=2 --set model.d_model=64 --set model.heads=1 --set model.seq_len=32
      --set train.device=cuda)  # head size 64: the CUDA attention takes 64, 80 or 128
fail=0
check() {  # NAME EXPECTED_CODE NEEDLE OUTPUT CODE
  if [ "$5" = "$2" ] && grep -qF -- "$3" <<<"$4"; then echo "ok: $1"; else echo "FAIL: $1 (exit $5)"; echo "$4" | tail -5; fail=1; fi
}
out=$($B launch --nproc-per-node 2 -- "${args[@]}" --set comm.backend=nccl --run-dir "$W/nccl" 2>&1); code=$?
check "nccl with two ranks on one GPU is refused" 2 "both use cuda:0, and NCCL refuses two ranks on one device" "$out" $code
out=$($B launch --nproc-per-node 2 -- "${args[@]}" --run-dir "$W/auto" 2>&1); code=$?
check "auto picks Gloo with host staging and trains" 0 "ranks share 1 GPU(s) on this node: Gloo with host staging" "$out" $code
# Asynchronous saves on the GPU (checkpoint.async, the default): the synchronous save's bytes, and
# a run resumed from step 2 ends with them too.
ck=(--set train.steps=4 --set checkpoint.every=2 --set checkpoint.keep_last=0)
$B "${args[@]}" "${ck[@]}" --set checkpoint.async=false --run-dir "$W/sync" >/dev/null 2>&1
$B "${args[@]}" "${ck[@]}" --run-dir "$W/async" >/dev/null 2>&1
$B "${args[@]}" "${ck[@]}" --set train.steps=2 --run-dir "$W/resumed" >/dev/null 2>&1
out=$($B "${args[@]}" "${ck[@]}" --resume auto --run-dir "$W/resumed" 2>&1); code=$?
same=yes
for s in 2 4; do
  d=checkpoints/step_0000000$s
  cmp -s "$W/sync/$d/shard_00000.bin" "$W/async/$d/shard_00000.bin" || same="no (async, step $s)"
done
cmp -s "$W/sync/checkpoints/step_00000004/shard_00000.bin" "$W/resumed/checkpoints/step_00000004/shard_00000.bin" || same="no (resumed)"
[ -s "$W/sync/checkpoints/step_00000004/shard_00000.bin" ] || same="no (nothing saved)"
check "asynchronous saves on the GPU: the synchronous bytes, bitwise resume ($same)" 0 "resume: " "$out" "$([ "$same" = yes ] && echo $code || echo 1)"
# The node's self-check on the GPU (what a supervised launch runs between attempts): cuBLASLt's
# GEMM checked exactly, and the GPU's memory.
out=$($B self-check --checkpoint-dir "$W/sc" --device cuda 2>&1); code=$?
check "the self-check computes on the GPU and checks its memory" 0 "1 GPU(s): GEMM " "$out" $code
# A supervised launch on the GPU: a worker killed after step 3 is restarted after stop and check
# (the GPU's self-check included) and the run ends.
out=$(MYRIAD_INJECT_FAULT=step:3:kill@rank=1 $B launch --nproc-per-node 2 --max-restarts 1 -- "${args[@]}" "${ck[@]}" \
      --set checkpoint.async=false --run-dir "$W/restart" 2>&1); code=$?
check "a killed GPU worker is restarted after the GPU's self-check" 0 "1 GPU(s): GEMM " "$out" $code
# Preemption on the GPU: SIGTERM some steps in; the trainer saves that step (state copied off the
# device) and exits 6; --resume auto ends with the unbroken run's bytes.
pre=(--set train.steps=300 --set checkpoint.every=1000 --set train.log_every=1)
$B "${args[@]}" "${pre[@]}" --run-dir "$W/whole" >/dev/null 2>&1
MYRIAD_INJECT_FAULT=step:1:slow:20 $B "${args[@]}" "${pre[@]}" --run-dir "$W/cut" > "$W/cut.log" 2>&1 & pid=$!
for _ in $(seq 300); do grep -q "step 30/" "$W/cut.log" && break; sleep 0.1; done
kill -TERM $pid; wait $pid; code=$?
out=$($B "${args[@]}" "${pre[@]}" --resume auto --run-dir "$W/cut" 2>&1)
same=yes
cmp -s "$W/whole/checkpoints/step_00000300/shard_00000.bin" "$W/cut/checkpoints/step_00000300/shard_00000.bin" || same=no
check "SIGTERM on the GPU: the step saved, exit 6, the resume bitwise ($same)" 6 "preempted: step " \
      "$(cat "$W/cut.log")" "$([ "$same" = yes ] && echo $code || echo 1)"
rm -rf "$W"
exit $fail
