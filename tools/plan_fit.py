#!/usr/bin/python3
"""Fits the planner's calibration constants to MegaScale's Table 2 and ablation, once, for all rows.

    /usr/bin/python3 tools/plan_fit.py [--myriad build/myriad] [--rounds N]   # prints the best [calibration]
    /usr/bin/python3 tools/plan_fit.py --check CLUSTER.toml                    # the table with the errors

The paper's numbers (NSDI 2024, arXiv 2402.15627: Table 2; Table 3's ablation at 256 GPUs, batch
256, the last step at batch 768) are the targets. Each evaluation runs `myriad plan`; the search is
a coordinate descent over the constants of [calibration] (and the fitted network and efficiency
figures), minimizing the largest error as a share of its tolerance (3 MFU points for Table 2, 2
for the ablation), then the sum of squared errors.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

TABLE2 = [  # GPUs, batch, Megatron-LM MFU, MegaScale MFU
    (256, 768, 53.0, 65.3), (512, 768, 49.9, 63.5), (768, 768, 46.7, 61.3), (1024, 768, 44.7, 59.0),
    (3072, 6144, 48.7, 59.1), (6144, 6144, 47.8, 57.3), (8192, 6144, 43.3, 54.9), (12288, 6144, 41.2, 55.2)]
ABLATION = [  # cumulative features at 256 GPUs, batch 256 (the last at 768 with LAMB), MFU
    ("megatron", 256, 47.7), ("parallel_block", 256, 52.3), ("parallel_block,window=512", 256, 53.3),
    ("parallel_block,window=512,tp_overlap", 256, 55.5),
    ("parallel_block,window=512,tp_overlap,pp_overlap", 256, 58.0),
    ("parallel_block,window=512,tp_overlap,pp_overlap,dp_overlap", 256, 59.5),
    ("parallel_block,window=512,tp_overlap,pp_overlap,dp_overlap,fused_ops", 256, 61.2),
    ("parallel_block,window=512,tp_overlap,pp_overlap,dp_overlap,fused_ops,misc", 256, 62.3),
    ("megascale", 768, 65.3)]
LAYOUT = "tp=8,pp=8,v=6,mb=1"
FRACTIONS = (0.2, 0.05, 0.015)  # of each constant's range, the steps tried
FITTED = {  # key: (section, low, high)
    "gemm_efficiency": ("gpu", 0.6, 0.9), "attention_efficiency": ("gpu", 0.15, 0.6),
    "nvlink_gbps": ("node", 80, 300), "gbps_per_gpu": ("network", 8, 25),
    "spine_oversubscription": ("network", 1.0, 4.0),
    "unfused_memory_passes": ("calibration", 10, 120), "fused_memory_passes": ("calibration", 5, 60),
    "tp_overlap_hidden": ("calibration", 0.2, 0.95), "pp_blocking": ("calibration", 0.5, 6),
    "misc_overhead": ("calibration", 0.0, 0.06), "step_overhead_s": ("calibration", 0.0, 1.5),
}


def mfu(myriad, cluster, gpus, batch, features):
    out = subprocess.run([myriad, "plan", "--config", "configs/gpt-175b.toml", "--gpus", str(gpus), "--cluster",
                          cluster, "--batch", str(batch), "--layout", LAYOUT, "--features", features],
                         capture_output=True, text=True, check=True).stdout
    return float(re.search(r"MFU ([0-9.]+)%", out).group(1))


def rows(myriad, cluster):
    """(what, target, predicted) for every row of Table 2 and every step of the ablation."""
    out = []
    for gpus, batch, megatron, megascale in TABLE2:
        out.append((f"{gpus} GPUs, Megatron-LM", megatron, mfu(myriad, cluster, gpus, batch, "megatron")))
        out.append((f"{gpus} GPUs, MegaScale", megascale, mfu(myriad, cluster, gpus, batch, "megascale")))
    for features, batch, target in ABLATION:
        out.append((f"ablation {features} (batch {batch})", target, mfu(myriad, cluster, 256, batch, features)))
    return out


def write_cluster(base_text, values, path):
    text = base_text
    for key, v in values.items():
        text = re.sub(rf"(?m)^{key} = [0-9.e+-]+", f"{key} = {v:.4g}", text)
    with open(path, "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--myriad", default="build/myriad")
    ap.add_argument("--cluster", default="configs/clusters/a100-megascale.toml")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--fine", action="store_true", help="smaller steps, from the file's values")
    args = ap.parse_args()
    if args.check:
        worst = 0
        for what, target, got in rows(args.myriad, args.cluster):
            worst = max(worst, abs(got - target))
            print(f"{what:75s} paper {target:5.1f}  plan {got:5.1f}  error {got - target:+5.1f}")
        print(f"largest error {worst:.1f} MFU points")
        return 0
    base = open(args.cluster).read()
    values = {k: float(re.search(rf"(?m)^{k} = ([0-9.e+-]+)", base).group(1)) for k in FITTED}
    tmp = os.path.join(tempfile.mkdtemp(), "cluster.toml")

    def cost(vals):  # the largest error as a share of its tolerance (Table 2: 3 points, ablation: 2)
        write_cluster(base, vals, tmp)
        r = rows(args.myriad, tmp)
        tol = [2 if what.startswith("ablation") else 3 for what, _, _ in r]
        return max(abs(g - t) / k for (_, t, g), k in zip(r, tol)), sum((g - t) ** 2 for _, t, g in r)

    def sane(vals):  # fused operators make fewer passes than unfused ones; misc removes something
        return vals["fused_memory_passes"] <= 0.9 * vals["unfused_memory_passes"] and vals["misc_overhead"] >= 0.005

    best = cost(values)
    for rnd in range(args.rounds):
        for key, (_, lo, hi) in FITTED.items():
            for frac in ((0.02, 0.006, 0.002) if args.fine else FRACTIONS):
                for sign in (-1, 1):
                    trial = dict(values)
                    trial[key] = min(hi, max(lo, values[key] + sign * frac * (hi - lo)))
                    if not sane(trial):
                        continue
                    c = cost(trial)
                    if c < best:
                        best, values = c, trial
        print(f"round {rnd + 1}: largest error / tolerance {best[0]:.2f}, squared sum {best[1]:.1f}", file=sys.stderr)
    print(json.dumps(values, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
