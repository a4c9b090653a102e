#!/usr/bin/env python3
"""Where a CUDA step's time goes, from the op profile (MYRIAD_OP_PROFILE=FILE myriad bench ...).

Each line of FILE is one step: every op's calls and milliseconds, summed by name and shape, and
the step's span on the device. This prints a markdown table of the median step (the first
--skip steps left out: they tune GEMMs and warm caches): each op's time, its share of the span,
and, for GEMMs and attention, the TFLOP/s it ran at; then the totals by kind and the time the
device spent outside the op set (the optimizer's update, collectives, and idle gaps).

  tools/op_profile.py FILE [--skip 3]
"""
import argparse
import json
import statistics
import sys


def flops(name):
    """FLOPs of one call, from the shape in the op's name; None for memory-bound ops."""
    op, _, shape = name.partition(" ")
    dims = [int(x) for x in shape.split("x")] if shape else []
    if op.startswith("linear_") and len(dims) == 3:
        n, ic, oc = dims
        return 2.0 * n * ic * oc
    if op.startswith("attention_") and len(dims) == 4:
        b, t, h, d = dims
        fwd = 4.0 * b * h * t * t * d / 2  # causal: half the score matrix
        return fwd if op == "attention_forward" else 2.5 * fwd
    return None


def kind(name):
    op = name.split(" ")[0]
    if op.startswith("linear_"):
        return "GEMMs (cuBLASLt, epilogues included)"
    if op.startswith("attention_"):
        return "attention"
    return "other ops (norms, embedding, cross-entropy, copies)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--skip", type=int, default=3)
    a = ap.parse_args()
    try:
        steps = [json.loads(line) for line in open(a.file) if line.strip()]
    except (OSError, ValueError) as e:
        sys.exit(f"op_profile: cannot read {a.file}: {e}")
    steps = steps[a.skip:]
    if not steps:
        sys.exit(f"op_profile: {a.file} has no steps after the first {a.skip}: run more steps")
    span = statistics.median(s["span_ms"] for s in steps)
    names = sorted({n for s in steps for n in s["ops"]})
    rows = []
    for n in names:
        ms = statistics.median(s["ops"].get(n, [0, 0.0])[1] for s in steps)
        calls = max(s["ops"].get(n, [0, 0])[0] for s in steps)
        f = flops(n)
        rows.append((ms, n, calls, f * calls / (ms / 1e3) / 1e12 if f and ms > 0 else None))
    rows.sort(reverse=True)
    print(f"median of {len(steps)} steps; the step's span on the device: {span:.1f} ms\n")
    print("| op (shape) | calls | ms per step | share | TFLOP/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for ms, n, calls, tf in rows:
        print(f"| {n} | {calls} | {ms:.2f} | {100 * ms / span:.1f}% | {'' if tf is None else f'{tf:.0f}'} |")
    totals = {}
    for ms, n, _, _ in rows:
        totals[kind(n)] = totals.get(kind(n), 0.0) + ms
    inside = sum(totals.values())
    print("\n| kind | ms per step | share |")
    print("| --- | ---: | ---: |")
    for k, ms in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"| {k} | {ms:.1f} | {100 * ms / span:.1f}% |")
    print(f"| outside the op set (update, collectives, idle gaps) | {span - inside:.1f} | {100 * (span - inside) / span:.1f}% |")


if __name__ == "__main__":
    main()
