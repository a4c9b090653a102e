#!/usr/bin/env bash
# On a GPU machine: Myriad's CUDA training throughput next to PyTorch (bench/torch_gpt.py, or
# bench/torch_llama.py for the Llama rows; torch.compile) on the same model, batch and GPU, one
# after the other in the same call.
# Expects the binary unpacked by scripts/gpu_check.sh (or MYRIAD=path). Prints one line per
# config and writes $OUT/bench_gpu.jsonl.
#   bench/gpu_vs_torch.sh [NAME...]    NAME in: gpt2-124m gpt2-350m gpt-1.3b gpt-2.7b gpt-1.3b-pw
#                                                llama-1b llama-3b
# NAME-fp8 runs Myriad with train.precision = "fp8" against the reference's FP8 (torchao's
# tensorwise recipe: bench/torch_llama.py --fp8, bench/torch_gpt_fp8.py) and against the
# reference in bf16 ("pytorch_bf16" in the JSON line). A Myriad run that fails skips the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
MYRIAD=${MYRIAD:-/tmp/m/bin/myriad}
# The libraries scripts/stage_device.sh packed beside the binary (Gloo, OpenBLAS, ...).
M=$(dirname "$MYRIAD")/..; source scripts/device_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
STEPS=${STEPS:-10}
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(gpt2-124m gpt2-350m gpt-1.3b gpt-1.3b-pw gpt-2.7b)
for name in "${names[@]}"; do
  ref=bench/torch_gpt.py
  fp8=; [ "${name%-fp8}" != "$name" ] && fp8=1
  case ${name%-fp8} in
    # Llama 3.2's shapes at T 2048, as the reference runs them (its RoPE unscaled: the same work).
    llama-1b)    cfg=configs/llama-3.2-1b.toml; B=8; ref=bench/torch_llama.py
                 extra=(--set model.seq_len=2048 --set train.recompute=none); targs=(--preset llama-1b) ;;
    llama-3b)    cfg=configs/llama-3.2-3b.toml; B=4; ref=bench/torch_llama.py
                 extra=(--set model.seq_len=2048 --set train.recompute=none); targs=(--preset llama-3b) ;;
    gpt2-124m)   cfg=configs/gpt2-124m.toml; B=32; extra=(); targs=(--preset gpt2-124m) ;;
    gpt2-350m)   cfg=configs/gpt2-350m.toml; B=32; extra=(); targs=(--preset gpt2-350m) ;;
    gpt-1.3b)    cfg=configs/gpt-1.3b.toml;  B=8;  extra=(); targs=(--preset gpt-1.3b) ;;
    gpt-1.3b-pw) cfg=configs/gpt-1.3b.toml;  B=8;  extra=(--set model.parallel_block=true --set model.window=1024)
                 targs=(--preset gpt-1.3b --parallel-block --window 1024) ;;
    gpt-2.7b)    cfg=configs/gpt-2.7b.toml;  B=8;  extra=(); targs=(--preset gpt-2.7b) ;;
    *) echo "unknown bench $name" >&2; exit 2 ;;
  esac
  if [ -n "$fp8" ]; then extra+=(--set train.precision=fp8); fi
  m=$("$MYRIAD" bench --config $cfg --set train.global_batch=$B --set train.micro_batch=$B "${extra[@]}" \
        --steps "$STEPS" --warmup 3 2>"$OUT/bench_$name.err" | tail -1)
  t=; tb=
  if [ -n "$m" ]; then
    if [ -n "$fp8" ]; then
      tb=$(python3 $ref "${targs[@]}" --steps "$STEPS" --warmup 5 2>"$OUT/torch_bf16_$name.err" | tail -1)
      if [ $ref = bench/torch_llama.py ]; then targs+=(--fp8); else ref=bench/torch_gpt_fp8.py; fi
    fi
    t=$(python3 $ref "${targs[@]}" --steps "$STEPS" --warmup 5 2>"$OUT/torch_$name.err" | tail -1)
  fi
  echo "{\"bench\": \"$name\", \"myriad\": ${m:-null}, \"pytorch\": ${t:-null}${fp8:+, \"pytorch_bf16\": ${tb:-null}}}" \
    >> "$OUT/bench_gpu.jsonl"
  python3 - "$name" "${m:-null}" "${t:-null}" "${tb:-null}" <<'PY'
import json, sys
name, m, t, tb = sys.argv[1], *(json.loads(a) for a in sys.argv[2:5])
tps = lambda r: r and (r.get("tokens_per_s") or r.get("tok_per_s"))
mt, tt = tps(m), tps(t)
ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "n/a"
# torch_gpt.py writes mfu, torch_llama.py mfu_bf16_peak (its MFU against the bf16 peak, FP8 runs too).
mfu = lambda r: (r.get("mfu") or r.get("mfu_bf16_peak") or 0) if r else 0
line = (f"{name:12s} myriad {mt or 0:9.0f} tok/s mfu {mfu(m):.3f} mem {m.get('peak_memory_gib', 0) if m else 0:.1f} GiB"
        f" | pytorch {tt or 0:9.0f} tok/s mfu {mfu(t):.3f} | ratio {ratio(mt, tt)}")
if tb is not None:
    line += f" | pytorch bf16 {tps(tb) or 0:9.0f} tok/s | ratio {ratio(mt, tps(tb))}"
print(line)
PY
done
