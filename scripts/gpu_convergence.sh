#!/usr/bin/env bash
# On a GPU machine: issue 28's convergence check. Trains a model of GPT-2's layout (gpt2-124m) and
# one of Llama's (12 layers, d 768, 12 query heads over 4 key/value heads, SwiGLU 2048, RoPE,
# RMSNorm; GPT-2's tokenizer) for STEPS steps of 16 x 1024 tokens on the corpus that
# scripts/doc_corpus.sh makes, once in bf16 and once in fp8, the same seed and data order, and
# writes every evaluation's validation loss to $OUT/convergence.jsonl (one line per run and
# evaluation) with the ratio fp8/bf16 printed at the end. RUNS (below) adds runs: other recipes,
# another seed.
#   DATA=/path/docs STEPS=2000 [RUNS="bf16:train.precision=bf16 fp8:..."] scripts/gpu_convergence.sh [gpt|llama]...
set -uo pipefail
cd "$(dirname "$0")/.."
MYRIAD=${MYRIAD:-/tmp/m/bin/myriad}
M=$(dirname "$MYRIAD")/..; source scripts/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DATA=${DATA:?DATA=prefix of docs_train/docs_valid}
STEPS=${STEPS:-2000}
runs=/tmp/convergence; mkdir -p $runs
common=(--set data.train="${DATA}_train" --set data.valid="${DATA}_valid" --set data.tokenizer=gpt2
        --set train.steps=$STEPS --set train.global_batch=16 --set train.micro_batch=16
        --set train.eval_every=$((STEPS / 20)) --set train.eval_steps=8 --set train.log_every=50
        --set optim.warmup_steps=$((STEPS / 20)) --set checkpoint.every=0)
llama=(--set model.norm=rmsnorm --set model.position_encoding=rope --set model.mlp=swiglu
       --set model.mlp_hidden=2048 --set model.kv_heads=4 --set model.bias=false --set model.tied_embeddings=true)
# RUNS: the runs of each shape, side by side on the one GPU (a small model leaves it room; each
# run's numbers do not depend on the others), NAME:KEY=VALUE,...; each is compared with "bf16".
RUNS=${RUNS:-"bf16:train.precision=bf16 fp8:train.precision=fp8"}
run() {  # SHAPE NAME KEY=VALUE,...
  local shape=$1 name=$2 extra=() sets=() start=$(date +%s) kv
  [ $shape = llama ] && extra=("${llama[@]}")
  IFS=, read -ra kv <<< "$3"
  for s in "${kv[@]}"; do sets+=(--set "$s"); done
  local dir=$runs/$shape-$name; rm -rf "$dir"  # this script's own run directory
  "$MYRIAD" train --config configs/gpt2-124m.toml "${common[@]}" "${extra[@]}" "${sets[@]}" \
    --run-dir "$dir" > "$dir.log" 2>&1
  echo "$shape $name rc=$? $(( $(date +%s) - start )) s"
}
shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(gpt llama)
for shape in "${shapes[@]}"; do
  for r in $RUNS; do run $shape "${r%%:*}" "${r#*:}" & done
  wait
  for r in $RUNS; do
    name=${r%%:*} dir=$runs/$shape-${r%%:*}
    python3 - "$dir/metrics.jsonl" "$shape" "$name" >> "$OUT/convergence.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "val_loss" in r:
        print(json.dumps({"model": sys.argv[2], "precision": sys.argv[3], "step": r["step"], "val_loss": r["val_loss"],
                          "loss": r.get("loss")}))
PY
    tail -3 "$dir.log"
  done
done
python3 - "$OUT/convergence.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for model in sorted({r["model"] for r in rows}):
    runs = {}
    for r in rows:
        if r["model"] == model: runs.setdefault(r["precision"], {})[r["step"]] = r["val_loss"]
    b = runs.get("bf16", {})
    for name, f in sorted(runs.items()):
        steps = sorted(set(b) & set(f))
        if name == "bf16" or not steps: continue
        worst = max(abs(f[s] / b[s] - 1) for s in steps)
        at = max(steps, key=lambda s: abs(f[s] / b[s] - 1))
        last = steps[-1]
        print(f"{model} {name}: {len(steps)} evaluations, worst |{name}/bf16 - 1| {worst:.4f} at step {at}; "
              f"at step {last}: bf16 {b[last]:.4f} {name} {f[last]:.4f} ({f[last] / b[last] - 1:+.4f})")
PY
