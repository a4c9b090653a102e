#!/usr/bin/env bash
# CPU training throughput of Myriad next to PyTorch (Debian's python3-torch) on the same model,
# in one run: same config, same threads, random tokens, AdamW, median step time.
#   bench/cpu_vs_torch.sh [CONFIG] [extra --set flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/demo.toml}; shift || true
THREADS=${OMP_NUM_THREADS:-$(nproc)}
STEPS=${STEPS:-10}
sets=(); for s in "$@"; do sets+=(--set "$s"); done

echo "config $CONFIG ${*:-}, $THREADS threads, $STEPS timed steps, $(date -u +%F), $(git rev-parse --short HEAD 2>/dev/null || echo no-git)"
myriad=$(OMP_NUM_THREADS=$THREADS build/myriad bench --config "$CONFIG" "${sets[@]}" --steps "$STEPS" --warmup 2)
torch=$(/usr/bin/python3 tools/torch_cpu_bench.py --config "$CONFIG" "${sets[@]}" --steps "$STEPS" --warmup 2 --threads "$THREADS")
echo "myriad:  $myriad"
echo "pytorch: $torch"
/usr/bin/python3 - "$myriad" "$torch" <<'PY'
import json, sys
m, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"tokens/s: myriad {m['tokens_per_s']:.0f}, pytorch {t['tokens_per_s']:.0f}, ratio {m['tokens_per_s'] / t['tokens_per_s']:.2f}x")
PY
