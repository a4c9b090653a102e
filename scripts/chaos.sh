#!/usr/bin/env bash
# A chaos run of the fault-tolerant driver (docs/RELIABILITY.md): NODES simulated nodes of 2
# workers each (default 4: 8 workers, tp 2 x dp 4) on this machine, a private redis-server on
# loopback, one spare agent waiting; every INTERVAL seconds (default 120) a random fault from the
# list: a worker killed (SIGKILL), a worker stopped (SIGSTOP), a node's agent killed (the node
# lost); after each, one more spare starts, as a cluster would bring one back. The job must finish by itself; then
#   ETTR = productive step time / wall time, the productive steps being those metrics.jsonl keeps
#   (a resume drops the recomputed ones), and the final weights against a fault-free run's.
#   STEPS=20000 INTERVAL=120 scripts/chaos.sh [MYRIAD_BINARY]
set -uo pipefail
cd "$(dirname "$0")/.."
B=$(realpath "${1:-build/myriad}")
NODES=${NODES:-4}; STEPS=${STEPS:-20000}; INTERVAL=${INTERVAL:-120}
W=$(mktemp -d); echo "chaos: work in $W"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile "$W/redis.log" >/dev/null
trap 'redis-cli -p $PORT shutdown nosave >/dev/null 2>&1; pkill -KILL -f "rdzv redis://127.0.0.1:$PORT" 2>/dev/null' EXIT
"$B" prepare --input README.md --input docs/ARCHITECTURE.md --input docs/CONFIG.md --input docs/RELIABILITY.md \
  --tokenizer byte --output "$W/d" >/dev/null 2>&1
train() {  # RUN_DIR
  echo train --config configs/demo.toml --run-dir "$1" --set model.layers=2 --set model.d_model=64 \
    --set model.seq_len=32 --set parallel.tp=2 --set parallel.dp=$NODES --set train.global_batch=$((2 * NODES)) \
    --set train.micro_batch=2 --set train.steps=$STEPS --set checkpoint.every=100 --set checkpoint.keep_last=2 \
    --set train.log_every=1 --set train.eval_every=0 --set data.train="$W/d" --set data.valid= \
    --set comm.timeout_s=300 --set fault.step_timeout_s=10
}
agents() {  # JOB RUN_DIR RESTARTS: every node's agent, in the background
  for n in $(seq 0 $((NODES - 1))); do
    OMP_NUM_THREADS=1 "$B" launch --nnodes "$NODES" --node-rank "$n" --node-name "node$n" --nproc-per-node 2 --max-restarts "$3" \
      --rdzv "redis://127.0.0.1:$PORT/$1" -- $(train "$2") >"$W/$1_node$n.txt" 2>&1 &
  done
}
spare() {  # JOB RUN_DIR (each spare a machine of its own name: an evicted name may not rejoin)
  local name="spare$RANDOM"
  OMP_NUM_THREADS=1 "$B" launch --nnodes "$NODES" --spare --node-name "$name" --nproc-per-node 2 --max-restarts 100 \
    --rdzv "redis://127.0.0.1:$PORT/$1" -- $(train "$2") >"$W/$1_$name.txt" 2>&1 &
}
# The fault-free run, for its weights.
t0=$(date +%s); agents ref "$W/ref" 0; wait; echo "chaos: the fault-free run took $(( $(date +%s) - t0 )) s"
# The chaos run.
start=$(date +%s.%N)
agents chaos "$W/chaos" 100
spare chaos "$W/chaos"
faults=0
while pgrep -f "rdzv redis://127.0.0.1:$PORT/chaos -- train" >/dev/null; do
  for s in $(seq "$INTERVAL"); do sleep 1; pgrep -f "rdzv redis://127.0.0.1:$PORT/chaos -- train" >/dev/null || break 2; done
  workers=($(pgrep -f "myriad train --config configs/demo.toml --run-dir $W/chaos"))
  [ ${#workers[@]} -eq $((2 * NODES)) ] || continue  # between attempts
  case $((RANDOM % 3)) in
    0) pid=${workers[$((RANDOM % ${#workers[@]}))]}; echo "chaos: $(date +%T) SIGKILL worker $pid"; kill -KILL "$pid" ;;
    1) pid=${workers[$((RANDOM % ${#workers[@]}))]}; echo "chaos: $(date +%T) SIGSTOP worker $pid"; kill -STOP "$pid" ;;
    2) node=$((RANDOM % NODES))
       pid=$(redis-cli -p "$PORT" get "myriad/chaos/driver/agent/node$node" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
       echo "chaos: $(date +%T) node $node lost (its agent $pid killed)"
       kill -KILL "$pid" ;;
  esac
  faults=$((faults + 1))
  spare chaos "$W/chaos"  # a node lost or evicted takes a spare: one more waits (idle ones leave at the end)
done
wait
end=$(date +%s.%N)
python3 - "$W" "$start" "$end" "$faults" "$STEPS" <<'PY'
import json, os, sys
w, start, end, faults, steps = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rows = [json.loads(l) for l in open(os.path.join(w, "chaos/metrics.jsonl"))]
productive = sum(r["step_ms"] for r in rows) / 1e3  # every step logged once: a resume drops the recomputed
last = rows[-1]["step"] if rows else 0
events = [json.loads(l) for l in open(os.path.join(w, "chaos/driver/events.jsonl"))]
kinds = {}
for e in events: kinds[e["event"]] = kinds.get(e["event"], 0) + 1
same = all(open(os.path.join(w, "chaos/checkpoints/step_%08d" % steps, f), "rb").read() ==
           open(os.path.join(w, "ref/checkpoints/step_%08d" % steps, f), "rb").read()
           for f in os.listdir(os.path.join(w, "ref/checkpoints/step_%08d" % steps)) if f.startswith("shard_"))
print("chaos: %d faults in %.0f s, finished step %d of %d; events %s; ETTR %.1f%%; final weights %s the fault-free run's"
      % (faults, end - start, last, steps, kinds, 100 * productive / (end - start), "equal to" if same else "DIFFER from"))
PY
