#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu_check.sh unpacked the build into /tmp/m: context parallelism
# on the CUDA op set, the cp ranks sharing the one GPU (Gloo with host staging), each run 20 steps
# through the launcher against the one-GPU run (every loss within 1%, as the other layouts'):
# cp 2 and cp 4 with learned positions; the Llama block in cp 2, cp 4, cp 2 x tp 2 + sp,
# cp 2 x dp 2 and cp 2 x pp 2; Llama cp 2 with one micro-batch a step (each step's forward of
# layer 0 right after the last backward's; before 047b1bd it reused that gather); attention inside documents with a window smaller than a chunk in
# cp 2 and cp 4; a cp 2 x dp 2 run killed at step 14 and restarted ends with the unbroken run's
# weights, bit for bit; cuDNN under cp (train.attention = "cudnn", and "auto" when not
# deterministic) against one GPU on cuDNN, at 1,024 tokens, and with documents.
# Prints one line per check ("ok: ..." or "FAIL: ...") and exits nonzero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/gpu_check_lib.sh

train1 one
launch cp2 2 --set parallel.cp=2
compare "cp 2 (learned positions)" cp2 one
launch cp4 4 --set parallel.cp=4
compare "cp 4 (learned positions)" cp4 one

train1 llama_one "${llama[@]}"
launch llama_cp2 2 "${llama[@]}" --set parallel.cp=2
compare "Llama: cp 2" llama_cp2 llama_one
launch llama_cp4 4 "${llama[@]}" --set parallel.cp=4
compare "Llama: cp 4" llama_cp4 llama_one
launch llama_cp2_tp2 4 "${llama[@]}" --set parallel.cp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true
compare "Llama: cp 2 x tp 2 + sp" llama_cp2_tp2 llama_one
launch llama_cp2_dp2 4 "${llama[@]}" --set parallel.cp=2 --set parallel.dp=2
compare "Llama: cp 2 x dp 2" llama_cp2_dp2 llama_one
launch llama_cp2_pp2 4 "${llama[@]}" --set parallel.cp=2 --set parallel.pp=2
compare "Llama: cp 2 x pp 2" llama_cp2_pp2 llama_one
train1 llama_one_mb "${llama[@]}" --set train.global_batch=2 --set train.micro_batch=2
launch llama_cp2_one_mb 2 "${llama[@]}" --set train.global_batch=2 --set train.micro_batch=2 --set parallel.cp=2
compare "Llama: cp 2, one micro-batch a step" llama_cp2_one_mb llama_one_mb
MYRIAD_INJECT_FAULT=step:14:kill@rank=1 LFLAGS="--max-restarts 1" launch llama_cp2_dp2_killed 4 "${llama[@]}" \
  --set parallel.cp=2 --set parallel.dp=2
resumed_bitwise "Llama cp 2 x dp 2 with rank 1 killed at step 14, restarted" llama_cp2_dp2 llama_cp2_dp2_killed

# Documents crossing the chunks and ranks, with a window (12) smaller than a cp 2 chunk (16).
documents_corpus
train1 docs_one "${llama[@]}" "${docs[@]}" --set model.window=12
launch docs_cp2 2 "${llama[@]}" "${docs[@]}" --set model.window=12 --set parallel.cp=2
compare "documents + window 12: cp 2" docs_cp2 docs_one
launch docs_cp4 4 "${llama[@]}" "${docs[@]}" --set model.window=12 --set parallel.cp=4
compare "documents + window 12: cp 4" docs_cp4 docs_one

# cuDNN under cp (one call a chunk): chunks of 128 and more (cuDNN before 9.16 wants multiples of
# 128), against one GPU on cuDNN; cp 4 with a window (200) smaller than its chunk (256); "auto"
# takes cuDNN under cp when not deterministic (its log says so).
cudnn=(--set model.seq_len=1024 --set train.steps=10 --set train.attention=cudnn)
train1 cudnn_one "${llama[@]}" "${cudnn[@]}"
launch cudnn_cp2 2 "${llama[@]}" "${cudnn[@]}" --set parallel.cp=2
compare "cuDNN: cp 2 at 1,024 tokens" cudnn_cp2 cudnn_one
train1 cudnn_one_w "${llama[@]}" "${cudnn[@]}" --set model.window=200
launch cudnn_cp4_w 4 "${llama[@]}" "${cudnn[@]}" --set model.window=200 --set parallel.cp=4
compare "cuDNN: cp 4, window 200" cudnn_cp4_w cudnn_one_w
launch cudnn_auto_cp2 2 "${llama[@]}" "${cudnn[@]}" --set train.attention=auto --set train.deterministic=false \
  --set parallel.cp=2
compare "auto, not deterministic: cp 2" cudnn_auto_cp2 cudnn_one
if grep -rqs "queries against" "$W/cudnn_auto_cp2.log" "$W/cudnn_auto_cp2"; then
  say "ok: auto under cp, not deterministic, runs cuDNN"
else
  say "FAIL: auto under cp, not deterministic, did not run cuDNN"; fail=1
fi
# Documents on cuDNN (the rows' document starts a mask of its graph), one GPU and cp 2.
train1 cudnn_docs_one "${llama[@]}" "${docs[@]}" "${cudnn[@]}"
launch cudnn_docs_cp2 2 "${llama[@]}" "${docs[@]}" "${cudnn[@]}" --set parallel.cp=2
compare "cuDNN: documents, cp 2" cudnn_docs_cp2 cudnn_docs_one

[ "$fail" = 0 ] || cp "$W"/*.log "$OUT/" 2>/dev/null
rm -rf "$W"
exit $fail
