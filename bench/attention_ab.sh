#!/usr/bin/env bash
# On a GPU machine: Myriad's own attention kernels in two builds of test_gpu, side by side in one
# call (AttentionBench: forward and backward of every tiling the sweeps try), interleaved
# A, B, A, B so that drift in the GPU's clocks falls on both. For a change to the kernels: stage
# the old test_gpu under another name beside the new one (scripts/stage_device.sh), then
#   bench/attention_ab.sh test_gpu_before test_gpu     (binaries under /tmp/m/bin)
set -uo pipefail
cd "$(dirname "$0")/.."
M=/tmp/m; source scripts/device_env.sh
F='AttentionBench.D128T2048Causal:AttentionBench.D128T2048Documents:AttentionBench.Llama1bGqa'
F+=':AttentionBench.D64T1024Causal:AttentionBench.D80T2048Causal:AttentionBench.D128T4096Window1024'
for round in 1 2; do
  for b in "$1" "$2"; do
    echo "== $b round $round"
    $M/bin/$b --gtest_filter="$F" 2>&1 | grep -E "^BENCH|FAILED|PASSED"
  done
done | tee /dev/stderr | python3 -c '
import re, statistics, sys
cur, t = None, {}
for l in sys.stdin:
    m = re.match(r"== (\S+) round", l)
    if m: cur = m.group(1); continue
    m = re.match(r"BENCH (.*?): fwd ([\d.]+) ms .*?\| bwd ([\d.]+) ms", l)
    if m: t.setdefault(m.group(1), {}).setdefault(cur, []).append(float(m.group(2)) + float(m.group(3)))
a, b = sys.argv[1], sys.argv[2]
r = [statistics.mean(v[b]) / statistics.mean(v[a]) for v in t.values() if a in v and b in v]
print(f"{len(r)} configurations: forward + backward time {b}/{a} median {statistics.median(r):.3f}, range {min(r):.3f}-{max(r):.3f}")
' "$1" "$2"
