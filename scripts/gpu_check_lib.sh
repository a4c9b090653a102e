#!/usr/bin/env bash
# Sourced by the GPU layout checks (scripts/gpu_layouts_check.sh, scripts/gpu_cp_check.sh), on a
# GPU machine after scripts/gpu_check.sh unpacked the build into /tmp/m: the snapshot corpus, the
# small model's arguments (args) and the helpers that train, launch and compare runs, each
# printing "ok: ..." or "FAIL: ..." and setting fail=1 on a failure. W is the scratch folder.
B=/tmp/m/bin/myriad
source scripts/device_env.sh  # the packed libraries and cuDNN
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
W=$(mktemp -d)
# The corpus is a snapshot (tests/gpu/corpus: the README and two docs as they were at fdb7fa7),
# not the docs of the day, so that editing the docs does not move these figures. Why: on
# 2026-12-05 Llama dp 2 and tp2 x pp2 x dp2 + sp measured 1.6% from one GPU on that day's docs
# (within 0.4% before), with kernels whose arithmetic had not changed; on the CPU both corpora
# run bit for bit alike in the old and new binaries, and the day's corpus has a loss rise of
# 0.32 at step 14 where the snapshot's largest is 0.19. A suspected cause, not yet rerun on the
# GPU with this snapshot.
C=tests/gpu/corpus
$B prepare --input $C/readme.txt --input $C/architecture.txt --input $C/reliability.txt \
  --tokenizer byte --output "$W/d" >/dev/null 2>&1
args=(train --config configs/demo.toml --set data.train="$W/d" --set data.valid= --set train.steps=20
      --set model.layers=4 --set model.d_model=128 --set model.heads=2 --set model.seq_len=64
      --set train.micro_batch=2 --set train.global_batch=8 --set train.device=cuda
      --set train.log_every=1 --set train.eval_every=0 --set optim.warmup_steps=5 --set optim.lr=1e-3
      --set checkpoint.every=10 --set checkpoint.keep_last=0)
# The Llama block: RMSNorm, RoPE, SwiGLU, 4 query heads of 64 over 2 key/value heads, an untied head.
llama=(--set model.d_model=256 --set model.heads=4 --set model.kv_heads=2 --set model.norm=rmsnorm
       --set model.position_encoding=rope --set model.mlp=swiglu --set model.mlp_hidden=688
       --set model.tied_embeddings=false --set model.bias=false)
fail=0
say() { echo "$@"; }
# compare NAME RUN REF [TOLERANCE]: every step's loss within TOLERANCE (default 1%) of the
# reference's; the median step time.
compare() {
  python3 - "$1" "$W/$2/metrics.jsonl" "$W/$3/metrics.jsonl" "${4:-0.01}" <<'EOF' || fail=1
import json, sys, statistics
name, a, b, tol = sys.argv[1:]
tol = float(tol)
ra = [json.loads(l) for l in open(a)]
rb = [json.loads(l) for l in open(b)]
if len(ra) != len(rb) or not ra:
    print(f"FAIL: {name}: {len(ra)} steps against {len(rb)}"); sys.exit(1)
worst = max(abs(x["loss"] - y["loss"]) / y["loss"] for x, y in zip(ra, rb))
ms = statistics.median(x["step_ms"] for x in ra[1:])
ok = worst <= tol
ref = "the one-GPU run" if tol >= 0.01 else "the dp 2 run"
print(f"{'ok' if ok else 'FAIL'}: {name}: {len(ra)} steps, losses within {worst:.3%} of {ref} "
      f"(final {ra[-1]['loss']:.4f} vs {rb[-1]['loss']:.4f}); median step {ms:.1f} ms")
sys.exit(0 if ok else 1)
EOF
}
train1() {  # RUN [--set ...]: one process
  local rd=$1; shift
  $B "${args[@]}" --run-dir "$W/$rd" "$@" >"$W/$rd.log" 2>&1 || { say "FAIL: $rd (exit $?)"; tail -5 "$W/$rd.log"; fail=1; }
}
# WHAT REF RUN: RUN was restarted (its events say so) and its step-20 shards are REF's, bit for bit.
resumed_bitwise() {
  local same=1 f
  for f in "$W/$2"/checkpoints/step_00000020/shard_*.bin; do
    cmp -s "$f" "$W/$3/checkpoints/step_00000020/$(basename "$f")" || same=0
  done
  if [ "$same" = 1 ] && grep -q '"restart"' "$W/$3/driver/events.jsonl" 2>/dev/null; then
    say "ok: $1: the step-20 shards equal the unbroken run's, bit for bit"
  else
    say "FAIL: $1 (same shards: $same)"; tail -5 "$W/$3.log"; fail=1
  fi
}
launch() {  # RUN NPROC [launcher flags --] [--set ...]
  local rd=$1 n=$2; shift 2
  $B launch --nproc-per-node "$n" ${LFLAGS:-} -- "${args[@]}" --run-dir "$W/$rd" "$@" >"$W/$rd.log" 2>&1 ||
    { say "FAIL: $rd (exit $?)"; tail -8 "$W/$rd.log"; fail=1; }
}

# Each line of the snapshot a document, packed into rows (data.document_mask), into $W/p; docs:
# the arguments that train on it. At optim.lr 5e-4: at 1e-3 this corpus spikes at step 19
# without the end positions' loss, and bf16 and fp32 trajectories part there by percents
# (measured on dcf9d2d; the same runs at 5e-4 agree within 0.06%).
documents_corpus() {
  awk 'NF { print; print "%" }' $C/readme.txt $C/architecture.txt $C/reliability.txt > "$W/lines.txt"
  $B prepare --input "$W/lines.txt" --tokenizer byte --doc-separator % --output "$W/p" >/dev/null 2>&1
  docs=(--set data.train="$W/p" --set data.document_mask=true --set optim.lr=5e-4)
}
