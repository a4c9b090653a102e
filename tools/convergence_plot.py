#!/usr/bin/env python3
"""The validation-loss curves of scripts/gpu_convergence.sh's runs: one column per model, every run
(bf16, fp8, other recipes or seeds) on the same axes above, run/bf16 - 1 below with the issue's
bands (1% at every evaluation, 0.5% at the end). Needs matplotlib (Debian's python3-matplotlib: run it as /usr/bin/python3).
   /usr/bin/python3 tools/convergence_plot.py convergence.jsonl OUT.png"""
import json, sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

rows = [json.loads(line) for line in open(sys.argv[1])]
models = sorted({r["model"] for r in rows})
fig, axes = plt.subplots(2, len(models), figsize=(5 * len(models), 6), squeeze=False,
                         gridspec_kw={"height_ratios": [2, 1]}, sharex="col")
for i, m in enumerate(models):
    # Every run of the model (bf16, fp8, other recipes, another seed), each against bf16 below.
    names = sorted({r["precision"] for r in rows if r["model"] == m}, key=lambda p: (p != "bf16", p != "fp8", p))
    curve = {p: dict(sorted((r["step"], r["val_loss"]) for r in rows if r["model"] == m and r["precision"] == p))
             for p in names}
    top, bottom = axes[0][i], axes[1][i]
    for j, (p, c) in enumerate(curve.items()):
        top.plot(list(c), list(c.values()), marker=".", label=p, color=f"C{j}")
        if p != "bf16":
            steps = sorted(set(curve["bf16"]) & set(c))
            bottom.plot(steps, [100 * (c[s] / curve["bf16"][s] - 1) for s in steps], marker=".", label=p,
                        color=f"C{j}")
    top.set_title(f"{m}: validation loss")
    top.legend()
    for y, style in ((1, ":"), (-1, ":"), (0.5, "--"), (-0.5, "--"), (0, "-")):
        bottom.axhline(y, color="grey", linestyle=style, linewidth=0.8)
    bottom.set_ylabel("run / bf16 - 1 (%)")
    bottom.set_xlabel("step")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=80)
