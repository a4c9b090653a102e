#!/usr/bin/env bash
# `make demo`: prepare the fortunes corpus (bytes as tokens), train the demo GPT, sample from it.
# NPROC=N trains on N local processes through `myriad launch` (`make demo-3d`); CONFIG=FILE
# trains another model (`make demo-llama`: configs/demo-llama.toml); extra arguments go to
# `myriad train`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/myriad
RUN=${RUN_DIR:-runs/demo}
CONFIG=${CONFIG:-configs/demo.toml}

if [ ! -s data/fortunes_train.idx ] || [ ! -s data/fortunes_valid.idx ]; then
  mapfile -t inputs < <(find /usr/share/games/fortunes -maxdepth 1 -type f \
                          ! -name '*.dat' ! -name '*.u8' | sort)
  [ "${#inputs[@]}" -gt 0 ] || { echo "demo: no fortune files: run scripts/setup.sh" >&2; exit 2; }
  args=(); for f in "${inputs[@]}"; do args+=(--input "$f"); done
  "$BIN" prepare "${args[@]}" --tokenizer byte --output data/fortunes \
    --valid-fraction 0.05 --doc-separator %
fi

# --resume auto: a second `make demo` continues the run in $RUN (a finished one has nothing left
# to train, and is sampled again); a fresh run there would be refused, as it would overwrite
# the first one's checkpoints.
if [ -n "${NPROC:-}" ]; then
  "$BIN" launch --nproc-per-node "$NPROC" -- train --config "$CONFIG" --run-dir "$RUN" --resume auto "$@"
else
  "$BIN" train --config "$CONFIG" --run-dir "$RUN" --resume auto "$@"
fi

echo
echo "=== sample from $RUN (myriad sample --checkpoint $RUN --prompt ...) ==="
"$BIN" sample --checkpoint "$RUN" --prompt "Q: " --tokens 400 --temperature 0.8 --seed 7
