#!/usr/bin/env python3
# The figures of a chaos run (scripts/chaos.sh) from its work directory WORK: ETTR, the events,
# each fault class's median time from the fault to the job's first productive step (the first
# step past the furthest one reached when it struck: the replayed steps included) and to the
# restarted attempt's first step, and the final weights against the fault-free run's.
#   python3 tools/chaos_summary.py WORK
import json, os, statistics, sys
w = sys.argv[1]
start, end, faults, steps = open(os.path.join(w, "chaos_times")).read().split()
start, end, faults, steps = float(start), float(end), int(faults), int(steps)
run = os.path.join(w, "chaos")
rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
productive = sum(r.get("step_ms", 0) for r in rows) / 1e3  # every step logged once: a resume drops the recomputed
last = rows[-1]["step"] if rows else 0
events = []
for name in os.listdir(os.path.join(run, "driver")):
    if name.startswith("events") and name.endswith(".jsonl"):
        events += [dict(json.loads(l), file=name) for l in open(os.path.join(run, "driver", name))]
events.sort(key=lambda e: e["time"])
kinds = {}  # the job's events as node 0's agent wrote them (every agent writes its own copy)
for e in events:
    if e["file"] == "events.jsonl": kinds[e["event"]] = kinds.get(e["event"], 0) + 1
ended = {r["step"]: r["time"] for r in rows if "time" in r}
injected = [json.loads(l) for l in open(os.path.join(run, "driver", "injected.jsonl"))] if os.path.exists(os.path.join(run, "driver", "injected.jsonl")) else []
resumed = [e["time"] for e in events if e["event"] == "resumed"]
back, productive_back = {}, {}
for i, f in enumerate(injected):
    until = injected[i + 1]["time"] if i + 1 < len(injected) else float("inf")
    after = [t for t in resumed if f["time"] < t < until]
    back.setdefault(f["class"], []).append(after[0] - f["time"] if after else None)
    # The furthest step the job had reached when the fault struck: the last one logged then, or
    # one that ended after that look and before the fault took hold (and was not replayed).
    reached = max([f.get("step", 0)] + [s for s, t in ended.items() if t < f["time"]])
    nxt = ended.get(reached + 1)
    productive_back.setdefault(f["class"], []).append(nxt - f["time"] if nxt and nxt > f["time"] else None)
ref_dir = os.path.join(w, "ref/checkpoints/step_%08d" % steps)
same = None  # no fault-free run's final checkpoint to compare with
if os.path.isdir(ref_dir):
    same = all(open(os.path.join(run, "checkpoints/step_%08d" % steps, f), "rb").read() ==
               open(os.path.join(ref_dir, f), "rb").read() for f in os.listdir(ref_dir) if f.startswith("shard_"))
print("chaos: %d faults in %.0f s, finished step %d of %d; events %s; ETTR %.1f%%; final weights %s the fault-free run's"
      % (faults, end - start, last, steps, kinds, 100 * productive / (end - start), "equal to" if same else "DIFFER from" if same is False else "not compared with (none found) to"))
med = lambda ts: "%.1f s" % statistics.median(ts) if ts else "-"
for c, times in sorted(back.items()):
    got = [t for t in times if t is not None]
    prod = [t for t in productive_back[c] if t is not None]
    print("chaos: %-6s %d fault(s), %d recovered by a restart; median fault -> first productive step %s "
          "(-> the restarted attempt's first step %s)" % (c, len(times), len(got), med(prod), med(got)))
