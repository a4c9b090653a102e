#!/usr/bin/env python3
"""`myriad report RUN_DIR`: where a traced run's time went, rank by rank.

Reads RUN_DIR/traces/rank_*.jsonl (a run with observe.trace = true; observe/trace.h) and
RUN_DIR/metrics.jsonl, and writes
  RUN_DIR/report/heatmap.png   rank x step: each step's own time (less the waits on peers) over
                               the median rank's that step; rank x phase: each phase's time per
                               step over the median rank's
  RUN_DIR/report/curves.png    loss, tokens/s and MFU by step
  RUN_DIR/report/index.html    both pictures and the table of the slowest ranks
It prints the slowest ranks, slowest first. Plots with matplotlib (Debian's python3-matplotlib).
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


def load(run_dir):
    names, own, phase = {}, collections.defaultdict(dict), collections.defaultdict(lambda: collections.defaultdict(float))
    steps_of = collections.defaultdict(set)
    for path in sorted(glob.glob(os.path.join(run_dir, "traces", "rank_*.jsonl"))):
        for line in open(path):
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            if "clock_offset_us" in e:
                names[e["rank"]] = e.get("name", "rank %d" % e["rank"])
                continue
            if e.get("ph") != "X":
                continue
            rank, step = e["pid"], e.get("args", {}).get("step", 0)
            if e.get("tid") == 2:
                own[rank][step] = e["args"]["own_ms"]
                steps_of[rank].add(step)
            elif e.get("tid") == 1:
                phase[rank]["communication", step] += e["dur"] / 1e3
            elif e["name"] in PHASES:
                phase[rank][e["name"], step] += e["dur"] / 1e3
    return names, own, phase


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: report.py RUN_DIR")
    run_dir = sys.argv[1]
    names, own, phase = load(run_dir)
    if not own:
        print("myriad: input error: report: %s holds no traced steps (RUN_DIR/traces/rank_*.jsonl): train with "
              "--set observe.trace=true" % os.path.join(run_dir, "traces"), file=sys.stderr)
        sys.exit(2)
    ranks = sorted(names)
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
    slowness = {r: statistics.median(v for v in grid[i] if v == v) for i, r in enumerate(ranks)}
    order = sorted(ranks, key=lambda r: -slowness[r])

    out = os.path.join(run_dir, "report")
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

    metrics = []
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
        metrics = [json.loads(l) for l in open(path) if l.strip()]
    curves = [("loss", "loss"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU")]
    curves = [(k, t) for k, t in curves if any(k in m for m in metrics)]
    if curves:
        fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.2), squeeze=False)
        for ax, (key, title) in zip(axes[0], curves):
            pts = [(m["step"], m[key]) for m in metrics if key in m]
            ax.plot([p[0] for p in pts], [p[1] for p in pts])
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
        if curves:
            f.write("<h2>Training</h2><img src=curves.png>")
        f.write("<h2>Slowest ranks</h2><table border=1 cellpadding=4><tr><th>rank</th><th>where</th>"
                "<th>own time / median</th>%s</tr>%s</table>" % (
                    "".join("<th>%s ms/step</th>" % p for p in PHASES), rows))
    print("report: %d ranks, steps %d..%d; slowest ranks: %s; in %s" % (
        len(ranks), steps[0], steps[-1],
        ", ".join("%d (%s, %.2fx)" % (r, names[r], slowness[r]) for r in order[:3]), os.path.join(out, "index.html")))


if __name__ == "__main__":
    main()
