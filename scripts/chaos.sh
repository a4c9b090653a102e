#!/usr/bin/env bash
# A chaos run of the fault-tolerant driver (docs/RELIABILITY.md): NODES simulated nodes of 2
# workers each (default 4: 8 workers, tp 2 x dp 4) on this machine, a private redis-server on
# loopback, one spare agent waiting; every INTERVAL seconds (default 120) one fault strikes the
# running job, its class drawn at random without replacement (each class once in every
# len(CLASSES) faults, in a random order):
#   kill      a worker killed (SIGKILL)               stop   a worker stopped (SIGSTOP)
#   stall     a worker's training thread stuck         nan    a worker's loss not finite
#   spike     a worker's loss 1000 x (fault.spike_factor finds it)
#   sdc       one bit of a worker's parameters flipped (the replicas' check finds it)
#   diag      a worker killed, and its node's self-check then fails (the node is evicted)
#   lost      a node's agent killed (the node lost)
#   save      a worker's next checkpoint write fails
#   redis     the store restarted empty (the job must not notice)
# The worker-side faults go through the live injection files (core/fault.h: RUN_DIR/driver/
# inject_rank_<R>, inject_node<N>); after each fault that may cost a node one more spare starts,
# as a cluster would bring one back. The job must finish by itself. Then tools/chaos_summary.py
# WORK says, from metrics.jsonl, the events and RUN_DIR/driver/injected.jsonl (this script's
# record of each fault):
#   ETTR = productive step time / wall time (the steps metrics.jsonl keeps: a resume drops the
#   recomputed ones); per class, the median time from the fault to the job's first productive
#   step after it (the first step past the furthest one reached when it struck: the replayed
#   steps included), and to the restarted attempt's first step (the `resumed` event: the replay not
#   included); the final weights against a fault-free run's (same layout: bit for bit).
# `myriad report RUN_DIR` draws the run's timeline (report/timeline.png).
# REF=WORK reuses an earlier chaos run's work directory (same STEPS, NODES and EVERY): its
# corpus and its fault-free run, instead of preparing and running them again (the corpus is
# made from the repository's docs, which change; a fresh one would not be the run's).
#   STEPS=20000 INTERVAL=120 [CLASSES="kill stop ..."] [REF=WORK] scripts/chaos.sh [MYRIAD_BINARY]
set -uo pipefail
cd "$(dirname "$0")/.."
B=$(realpath "${1:-build/myriad}")
NODES=${NODES:-4}; STEPS=${STEPS:-20000}; INTERVAL=${INTERVAL:-120}; EVERY=${EVERY:-20}
CLASSES=(${CLASSES:-kill stop stall nan spike sdc diag lost save redis})
W=$(mktemp -d); echo "chaos: work in $W"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis() { redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --logfile "$W/redis.log" >/dev/null; }
redis
trap 'redis-cli -p $PORT shutdown nosave >/dev/null 2>&1; pkill -KILL -f "rdzv redis://127.0.0.1:$PORT" 2>/dev/null' EXIT
if [ -n "${REF:-}" ]; then
  for f in "$REF"/d.bin "$REF"/d.idx "$REF"/d.json; do ln -s "$(realpath "$f")" "$W/"; done
else
  "$B" prepare --input README.md --input docs/ARCHITECTURE.md --input docs/CONFIG.md --input docs/RELIABILITY.md \
    --tokenizer byte --output "$W/d" >/dev/null 2>&1
fi
train() {  # RUN_DIR
  echo train --config configs/demo.toml --run-dir "$1" --set model.layers=2 --set model.d_model=64 \
    --set model.seq_len=32 --set parallel.tp=2 --set parallel.dp=$NODES --set train.global_batch=$((2 * NODES)) \
    --set train.micro_batch=2 --set train.steps=$STEPS --set checkpoint.every=$EVERY --set checkpoint.keep_last=3 \
    --set train.log_every=1 --set train.eval_every=0 --set data.train="$W/d" --set data.valid= \
    --set comm.timeout_s=300 --set fault.spike_factor=3 --set fault.sdc_check_every=1
}
agents() {  # JOB RUN_DIR RESTARTS: every node's agent, in the background
  for n in $(seq 0 $((NODES - 1))); do
    OMP_NUM_THREADS=1 "$B" launch --nnodes "$NODES" --node-rank "$n" --node-name "node$n" --nproc-per-node 2 --max-restarts "$3" \
      --rdzv "redis://127.0.0.1:$PORT/$1" -- $(train "$2") >"$W/$1_node$n.txt" 2>&1 &
  done
}
spare() {  # JOB RUN_DIR (each spare a machine of its own name: an evicted name may not rejoin)
  local name="spare$RANDOM"
  OMP_NUM_THREADS=1 "$B" launch --nnodes "$NODES" --spare --node-name "$name" --nproc-per-node 2 --max-restarts 1000 \
    --rdzv "redis://127.0.0.1:$PORT/$1" -- $(train "$2") >"$W/$1_$name.txt" 2>&1 &
}
# The fault-free run, for its weights.
if [ -n "${REF:-}" ]; then
  ln -s "$(realpath "$REF/ref")" "$W/ref"; echo "chaos: the corpus and the fault-free run of $REF"
else
  t0=$(date +%s); agents ref "$W/ref" 0; wait; echo "chaos: the fault-free run took $(( $(date +%s) - t0 )) s"
fi
# The chaos run.
R="$W/chaos"; mkdir -p "$R/driver"
start=$(date +%s.%N)
agents chaos "$R" 1000
spare chaos "$R"
running() { pgrep -f "rdzv redis://127.0.0.1:$PORT/chaos -- train" >/dev/null; }
inject() {  # FILE ITEM: a live fault for a worker or a node's self-check
  printf '%s\n' "$2" > "$1.tmp" && mv "$1.tmp" "$1"
}
record() {  # CLASS TARGET (and the last step metrics.jsonl holds as it strikes)
  local step; step=$(tail -n 1 "$R/metrics.jsonl" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])' 2>/dev/null)
  printf '{"time": %s, "class": "%s", "target": "%s", "step": %s}\n' "$(date +%s.%N)" "$1" "$2" "${step:-0}" >> "$R/driver/injected.jsonl"
  echo "chaos: $(date +%T) $1 $2"
}
beat() {  # NODE EXPR: from that node's agent heartbeat in the store (j), e.g. its pid
  redis-cli -p "$PORT" get "myriad/chaos/driver/agent/node$1" | python3 -c "import json,sys; j=json.load(sys.stdin); print($2)" 2>/dev/null
}
faults=0
draw=()  # this cycle's classes not yet drawn
while running; do
  for s in $(seq "$INTERVAL"); do sleep 1; running || break 2; done
  workers=($(pgrep -f "myriad train --config configs/demo.toml --run-dir $R "))
  [ ${#workers[@]} -eq $((2 * NODES)) ] || continue  # between attempts
  rank=$((RANDOM % (2 * NODES))); node=$((rank / 2))
  pid=${workers[$((RANDOM % ${#workers[@]}))]}
  [ ${#draw[@]} -gt 0 ] || draw=("${CLASSES[@]}")
  k=$((RANDOM % ${#draw[@]})); class=${draw[$k]}; draw=("${draw[@]:0:$k}" "${draw[@]:$((k + 1))}")
  case $class in
    kill) record kill "worker $pid"; kill -KILL "$pid" ;;
    stop) record stop "worker $pid"; kill -STOP "$pid" ;;
    stall|nan|spike) record "$class" "rank $rank"; inject "$R/driver/inject_rank_$rank" "step:next:$class" ;;
    sdc) record sdc "rank $rank"; inject "$R/driver/inject_rank_$rank" "step:next:flip" ;;
    save) record save "rank $rank"; inject "$R/driver/inject_rank_$rank" "checkpoint_write:fail" ;;
    diag) victim=$(beat "$node" 'j["workers"][0]["pid"]'); [ -n "$victim" ] || { draw+=("$class"); continue; }
          record diag "node $node"; inject "$R/driver/inject_node$node" "diag:fail"; kill -KILL "$victim" ;;
    lost) agent=$(beat "$node" 'j["pid"]'); [ -n "$agent" ] || { draw+=("$class"); continue; }
          record lost "node $node"; kill -KILL "$agent" ;;
    redis) record redis "store"; redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1; sleep 1; redis ;;
  esac
  faults=$((faults + 1))
  case $class in diag|lost|sdc|stop) spare chaos "$R" ;; esac  # a node may leave: one more spare waits
done
wait
end=$(date +%s.%N)
echo "$start $end $faults $STEPS" > "$W/chaos_times"
python3 tools/chaos_summary.py "$W"
