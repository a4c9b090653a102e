#!/usr/bin/env python3
"""`myriad report RUN_DIR`: where a traced run's time went, rank by rank.

Reads RUN_DIR/traces/rank_*.jsonl (a run with observe.trace = true; observe/trace.h) and
RUN_DIR/metrics.jsonl, and writes
  RUN_DIR/report/heatmap.png   rank x step: each step's own time (less the waits on peers) over
                               the median rank's that step; rank x phase: each phase's time per
                               step over the median rank's
  RUN_DIR/report/curves.png    loss, tokens/s and MFU by step, and the validation losses (val_loss
                               and each source's val_loss/<name>) where the run evaluated
  RUN_DIR/report/experts.png   for a mixture of experts (metrics.jsonl's expert_load): layer x
                               expert over the logged steps, each expert's rows over its layer's
                               mean (1: balanced); made from the metrics alone, traced or not
  RUN_DIR/report/index.html    the pictures and the table of the slowest ranks
and, for a supervised launch (RUN_DIR/driver/events.jsonl), its faults and recoveries:
  RUN_DIR/report/timeline.png  wall time: productive, and each recovery's phases: detect (the
                               fault injected -> found; a chaos run records its faults in
                               driver/injected.jsonl), stop, check (self-checks), restart, and
                               load and first step (-> the first productive step)
It prints the slowest ranks, slowest first, and the recoveries. Plots with matplotlib (Debian's
python3-matplotlib).
"""
import collections
import glob
import html
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = ["data", "forward", "backward", "optimizer", "communication"]


class InputError(Exception):
    """A file that is not what Myriad writes: one line naming it, exit 2, as myriad's own errors."""


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def not_ours(where, field, want, e):
    got = ", got %s" % json.dumps(e[field])[:40] if field in e else " (missing)"
    return InputError("%s: %s must be %s%s: not a trace Myriad wrote; move the file out of traces/ or trace the "
                      "run again" % (where, field, want, got))


def check_event(e, where, rank):
    """The fields this report reads, of the types observe/trace.cc writes (as `myriad trace` checks)."""
    if not isinstance(e.get("ph"), str):
        raise not_ours(where, "ph", "an event phase", e)
    if not is_int(e.get("ts")):
        raise not_ours(where, "ts", "an integer (microseconds)", e)
    if e.get("pid") != rank or not is_int(e.get("pid")):
        raise not_ours(where, "pid", "the header's rank, %d" % rank, e)
    args = e.get("args", {})
    if not isinstance(args, dict) or not is_int(args.get("step", 0)):
        raise not_ours(where, "args", "an object whose step is an integer", e)
    if e["ph"] != "X":
        return
    if not is_int(e.get("tid")):
        raise not_ours(where, "tid", "an integer", e)
    if not is_number(e.get("dur")):
        raise not_ours(where, "dur", "a number (microseconds)", e)
    if not isinstance(e.get("name"), str):
        raise not_ours(where, "name", "a string", e)
    if e["tid"] == 2 and not is_number(args.get("own_ms")):
        raise not_ours(where, "args", "an object with own_ms, a number", e)


def parse(line):
    try:
        e = json.loads(line)
    except ValueError:
        return None
    return e if isinstance(e, dict) else None


def load(run_dir):
    names, own, phase = {}, collections.defaultdict(dict), collections.defaultdict(lambda: collections.defaultdict(float))
    steps_of = collections.defaultdict(set)
    for path in sorted(glob.glob(os.path.join(run_dir, "traces", "rank_*.jsonl"))):
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise InputError("%s cannot be read as text (%s): move it out of traces/" % (path, err))
        rank = None
        for i, line in enumerate(lines):
            where = "%s, line %d" % (path, i + 1)
            e = parse(line)
            if e is None:
                # A crash cuts at most the last line a start wrote: the file's last, or the one
                # before the next start's header.
                nxt = parse(lines[i + 1]) if i + 1 < len(lines) else None
                if rank is not None and (i + 1 == len(lines) or (nxt is not None and "clock_offset_us" in nxt)):
                    continue
                raise InputError("%s is not a JSON object: not a trace Myriad wrote; move the file out of traces/ "
                                 "or trace the run again" % where)
            if "clock_offset_us" in e:
                if not is_int(e.get("rank")) or e["rank"] < 0:
                    raise not_ours(where, "rank", "a rank number", e)
                if os.path.basename(path) != "rank_%d.jsonl" % e["rank"]:
                    raise InputError("%s: the header says rank %d: the file was renamed or copied; move it out of "
                                     "traces/" % (where, e["rank"]))
                if not isinstance(e.get("name", ""), str):
                    raise not_ours(where, "name", "a string", e)
                rank = e["rank"]
                names[rank] = e.get("name", "rank %d" % rank)
                continue
            if rank is None:
                raise InputError("%s: an event before the file's header {rank, name, clock_offset_us}: not a trace "
                                 "Myriad wrote; move the file out of traces/ or trace the run again" % where)
            check_event(e, where, rank)
            if e["ph"] != "X":
                continue
            step = e.get("args", {}).get("step", 0)
            if e["tid"] == 2:
                own[rank][step] = e["args"]["own_ms"]
                steps_of[rank].add(step)
            elif e["tid"] == 1:
                phase[rank]["communication", step] += e["dur"] / 1e3
            elif e["name"] in PHASES:
                phase[rank][e["name"], step] += e["dur"] / 1e3
        if rank is None:
            raise InputError("%s has no header {rank, name, clock_offset_us}: not a trace Myriad wrote; move the file "
                             "out of traces/ or trace the run again" % path)
    return names, own, phase


def load_metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            lines = [l for l in f.read().splitlines() if l.strip()]
    except (OSError, UnicodeDecodeError) as err:
        raise InputError("%s cannot be read as text (%s)" % (path, err))
    metrics = []
    for i, line in enumerate(lines):
        m = parse(line)
        if m is None:
            if i + 1 == len(lines):
                break  # a line cut by a crash
            raise InputError("%s, line %d is not a JSON object: not the metrics Myriad writes" % (path, i + 1))
        for key in ["step", "loss", "tokens_per_s", "mfu"] + [k for k in m if k.startswith("val_loss")]:
            if key in m and not (is_int(m[key]) if key == "step" else is_number(m[key])):
                raise InputError("%s, line %d: %s must be a number, got %s: not the metrics Myriad writes" % (
                    path, i + 1, key, json.dumps(m[key])[:40]))
        if "step" not in m:
            raise InputError("%s, line %d: step is missing: not the metrics Myriad writes" % (path, i + 1))
        metrics.append(m)
    return metrics


PHASE_COLORS = [("detect", "tab:red"), ("stop", "tab:orange"), ("check", "gold"), ("restart", "tab:purple"),
                ("load and first step", "tab:blue")]


def read_jsonl(path, what):
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise InputError("%s line %d is not JSON: not %s Myriad wrote" % (path, n, what))
    return out


def recoveries(run_dir):
    """Each fault of a supervised launch and its recovery's phase boundaries (Unix times), from
    RUN_DIR/driver/events*.jsonl (every node's) and a chaos run's driver/injected.jsonl."""
    driver = os.path.join(run_dir, "driver")
    events = []
    for path in sorted(glob.glob(os.path.join(driver, "events*.jsonl"))):
        events += read_jsonl(path, "an event file")
    if not events:
        return [], []
    injected = []
    if os.path.exists(os.path.join(driver, "injected.jsonl")):
        injected = read_jsonl(os.path.join(driver, "injected.jsonl"), "an injection record")
    first = collections.defaultdict(dict)  # attempt -> event -> its earliest time (any node)
    last_check = {}
    for e in events:
        a, kind, t = e.get("attempt", 0), e.get("event"), e.get("time", 0)
        if kind not in first[a] or t < first[a][kind]:
            first[a][kind] = t
        if kind == "diagnose" and str(e.get("detail", "")).startswith("self-check of node"):
            last_check[a] = max(last_check.get(a, 0), t)
    out = []
    for a in sorted(first):
        if "fault" not in first[a]:
            continue
        found = first[a]["fault"]
        before = [f for f in injected if f["time"] <= found]
        start = before[-1]["time"] if before else found
        if out and start < out[-1]["times"][-1]:
            start = found  # that injection was the last fault's
        stop = first[a].get("stop", found)
        check = last_check.get(a, stop)
        restart = first.get(a + 1, {}).get("restart", check)
        back = first.get(a + 1, {}).get("resumed")
        out.append({"attempt": a, "class": before[-1]["class"] if before and start != found else "",
                    "times": [start, found, stop, check, restart] + ([back] if back else [])})
    return out, events


def timeline(run_dir, out):
    """Writes report/timeline.png; returns its summary lines ([] without events)."""
    recs, events = recoveries(run_dir)
    if not events:
        return []
    t0 = min(e["time"] for e in events)
    injected_path = os.path.join(run_dir, "driver", "injected.jsonl")
    if os.path.exists(injected_path):
        t0 = min([t0] + [f["time"] for f in read_jsonl(injected_path, "an injection record")])
    t1 = max(e["time"] for e in events)
    fig, ax = plt.subplots(figsize=(14, 2.2))
    ax.broken_barh([(0, t1 - t0)], (0, 1), color="tab:green")
    lines = []
    for r in recs:
        ts = r["times"]
        for i in range(len(ts) - 1):
            ax.broken_barh([(ts[i] - t0, max(ts[i + 1] - ts[i], 0))], (0, 1), color=PHASE_COLORS[i][1])
        lost = ts[-1] - ts[0]
        phases = ", ".join("%s %.1f s" % (PHASE_COLORS[i][0], ts[i + 1] - ts[i]) for i in range(len(ts) - 1))
        lines.append("attempt %d%s: %.1f s lost (%s)%s" % (r["attempt"], " (%s)" % r["class"] if r["class"] else "",
                                                          lost, phases, "" if len(ts) == 6 else "; no restart"))
    ax.set_yticks([])
    ax.set_xlabel("seconds")
    ax.set_title("productive (green) and each recovery: " + ", ".join(
        "%s (%s)" % (name, color.replace("tab:", "")) for name, color in PHASE_COLORS))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "timeline.png"), dpi=100)
    plt.close(fig)
    return lines


def experts(metrics, out):
    """experts.png from each logged step's expert_load ({layer: [rows per expert]}); returns the
    line that describes it, or None when the run has no MoE layer."""
    steps = [m for m in metrics if "expert_load" in m]
    if not steps:
        return None
    for m in steps:
        load = m["expert_load"]
        if not isinstance(load, dict) or not all(
                isinstance(v, list) and v and all(is_number(x) for x in v) and k.isdigit() for k, v in load.items()):
            raise InputError("metrics.jsonl, step %s: expert_load must map each MoE layer to its rows per expert, got %s"
                             % (m["step"], json.dumps(load)[:60]))
    layers = sorted({int(k) for m in steps for k in m["expert_load"]})
    width = max(len(v) for m in steps for v in m["expert_load"].values())
    grid, labels = [], []
    for l in layers:
        for e in range(width):
            labels.append("%d.%d" % (l, e) if e == 0 else ".%d" % e)
            row = []
            for m in steps:
                v = m["expert_load"].get(str(l))
                mean = sum(v) / len(v) if v else 0
                row.append(v[e] / mean if v and e < len(v) and mean > 0 else float("nan"))
            grid.append(row)
    last = [x for x in (row[-1] for row in grid) if x == x]
    os.makedirs(out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(12, 1.5 + 0.18 * len(grid)))
    first, final = steps[0]["step"], steps[-1]["step"]
    im = ax.imshow(grid, aspect="auto", cmap="coolwarm", vmin=0, vmax=2, interpolation="nearest",
                   extent=(first - 0.5, final + 0.5, len(grid) - 0.5, -0.5))
    ax.set_yticks(range(len(grid)), labels, fontsize=6 if len(grid) > 40 else 8)
    ax.set_ylabel("layer.expert")
    ax.set_xlabel("step")
    ax.set_title("rows per expert / its layer's mean (1 = balanced)")
    fig.colorbar(im, ax=ax, fraction=0.03)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "experts.png"), dpi=100)
    plt.close(fig)
    return "expert load: %d MoE layers x %d experts over %d logged steps (%d..%d); at the last, the busiest expert " \
           "took %.2fx its layer's mean, the idlest %.2fx" % (len(layers), width, len(steps), first, final,
                                                              max(last or [0]), min(last or [0]))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RUN_DIR")
    run_dir = sys.argv[1]
    out = os.path.join(run_dir, "report")
    try:
        names, own, phase = load(run_dir)
        metrics = load_metrics(run_dir)
        has_events = bool(glob.glob(os.path.join(run_dir, "driver", "events*.jsonl")))
        if has_events:
            os.makedirs(out, exist_ok=True)
        recovered = timeline(run_dir, out) if has_events else []
        expert_line = experts(metrics, out)
    except InputError as err:
        print("myriad: input error: report: %s" % err, file=sys.stderr)
        sys.exit(2)
    for line in recovered:
        print("report: recovery: " + line)
    if expert_line:
        print("report: " + expert_line)
    expert_html = "<h2>Expert load</h2><img src=experts.png><p>%s</p>" % html.escape(expert_line) if expert_line else ""
    if not own and (has_events or expert_line):
        with open(os.path.join(out, "index.html"), "w") as f:
            f.write("<!doctype html><meta charset=utf-8><title>myriad report: %s</title>" % html.escape(run_dir))
            f.write("<h1>%s</h1>" % html.escape(run_dir) + expert_html)
            if has_events:
                f.write("<h2>Faults and recoveries</h2><img src=timeline.png><ul>%s</ul>" % (
                    "".join("<li>%s</li>" % html.escape(l) for l in recovered)))
        print("report: %d recoveries%s (no traced steps for the heat maps of time); in %s" % (
            len(recovered), ", the expert load" if expert_line else "", os.path.join(out, "index.html")))
        return
    if not own:
        print("myriad: input error: report: %s holds no traced steps (RUN_DIR/traces/rank_*.jsonl): train with "
              "--set observe.trace=true" % os.path.join(run_dir, "traces"), file=sys.stderr)
        sys.exit(2)
    ranks = sorted(r for r in names if own[r])  # (a rank that stopped before its first traced step: no row)
    steps = sorted(set().union(*(set(own[r]) for r in ranks)))
    # rank x step: own time over the step's median rank
    grid = []
    for r in ranks:
        row = []
        for s in steps:
            values = [own[q][s] for q in ranks if s in own[q]]
            med = statistics.median(values) if values else 0
            row.append(own[r].get(s, float("nan")) / med if med > 0 else float("nan"))
        grid.append(row)
    # rank x phase: each phase's median time per step over the median rank's
    per_phase = []
    for r in ranks:
        row = []
        for p in PHASES:
            mine = [phase[r].get((p, s), 0.0) for s in steps]
            row.append(statistics.median(mine) if mine else 0.0)
        per_phase.append(row)
    rel_phase = []
    for r_i, _ in enumerate(ranks):
        row = []
        for p_i, _ in enumerate(PHASES):
            med = statistics.median(per_phase[q][p_i] for q in range(len(ranks)))
            row.append(per_phase[r_i][p_i] / med if med > 0 else 1.0)
        rel_phase.append(row)
    # (a rank whose steps all took no time has no ratio: counted as the median's)
    slowness = {r: statistics.median([v for v in grid[i] if v == v] or [1.0]) for i, r in enumerate(ranks)}
    order = sorted(ranks, key=lambda r: -slowness[r])

    os.makedirs(out, exist_ok=True)
    labels = [names[r] for r in ranks]
    fig, axes = plt.subplots(1, 2, figsize=(14, 1.2 + 0.45 * len(ranks)), gridspec_kw={"width_ratios": [3, 1]})
    im = axes[0].imshow(grid, aspect="auto", cmap="magma_r", vmin=0.5, vmax=max(2.0, max(slowness.values())),
                        extent=(steps[0] - 0.5, steps[-1] + 0.5, len(ranks) - 0.5, -0.5), interpolation="nearest")
    axes[0].set_yticks(range(len(ranks)), labels)
    axes[0].set_xlabel("step")
    axes[0].set_title("own step time / the step's median rank")
    fig.colorbar(im, ax=axes[0], fraction=0.03)
    im2 = axes[1].imshow(rel_phase, aspect="auto", cmap="magma_r", vmin=0.5, vmax=2.0, interpolation="nearest")
    axes[1].set_xticks(range(len(PHASES)), PHASES, rotation=45, ha="right")
    axes[1].set_yticks(range(len(ranks)), [""] * len(ranks))
    axes[1].set_title("phase time / median rank's")
    fig.colorbar(im2, ax=axes[1], fraction=0.08)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "heatmap.png"), dpi=100)
    plt.close(fig)

    # One panel per curve; the validation panel holds val_loss and each source's val_loss/<name>.
    validation = sorted({k for m in metrics for k in m if k.startswith("val_loss")})
    curves = [("loss", ["loss"]), ("tokens/s", ["tokens_per_s"]), ("MFU", ["mfu"]), ("validation loss", validation)]
    curves = [(t, [k for k in keys if any(k in m for m in metrics)]) for t, keys in curves]
    curves = [(t, keys) for t, keys in curves if keys]
    if curves:
        fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.2), squeeze=False)
        for ax, (title, keys) in zip(axes[0], curves):
            for key in keys:
                pts = [(m["step"], m[key]) for m in metrics if key in m]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 20 else None,
                        label=key if len(keys) > 1 else None)
            if len(keys) > 1:
                ax.legend(fontsize=7)
            ax.set_title(title)
            ax.set_xlabel("step")
        fig.tight_layout()
        fig.savefig(os.path.join(out, "curves.png"), dpi=100)
        plt.close(fig)

    rows = "".join(
        "<tr><td>%d</td><td>%s</td><td>%.2fx</td>%s</tr>" % (
            r, html.escape(names[r]), slowness[r],
            "".join("<td>%.1f</td>" % per_phase[ranks.index(r)][i] for i in range(len(PHASES))))
        for r in order)
    with open(os.path.join(out, "index.html"), "w") as f:
        f.write("<!doctype html><meta charset=utf-8><title>myriad report: %s</title>" % html.escape(run_dir))
        f.write("<h1>%s</h1><h2>Where the time went, rank by rank</h2><img src=heatmap.png>" % html.escape(run_dir))
        f.write(expert_html)
        if curves:
            f.write("<h2>Training</h2><img src=curves.png><p>curves: %s</p>" % html.escape(
                "; ".join("%s (%s)" % (t, ", ".join(keys)) for t, keys in curves)))
        if recovered:
            f.write("<h2>Faults and recoveries</h2><img src=timeline.png><ul>%s</ul>" % "".join(
                "<li>%s</li>" % html.escape(l) for l in recovered))
        f.write("<h2>Slowest ranks</h2><table border=1 cellpadding=4><tr><th>rank</th><th>where</th>"
                "<th>own time / median</th>%s</tr>%s</table>" % (
                    "".join("<th>%s ms/step</th>" % p for p in PHASES), rows))
    print("report: %d ranks, steps %d..%d; slowest ranks: %s; in %s" % (
        len(ranks), steps[0], steps[-1],
        ", ".join("%d (%s, %.2fx)" % (r, names[r], slowness[r]) for r in order[:3]), os.path.join(out, "index.html")))


if __name__ == "__main__":
    main()
