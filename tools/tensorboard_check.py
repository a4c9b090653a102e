#!/usr/bin/env python3
"""Reads Myriad's TensorBoard event files with TensorBoard's own loader (the tensorboard package,
e.g. the GPU machine's Python) and prints, per directory, the scalar tags and the steps of
"lm loss": how the files were checked against the real thing (docs/PERFORMANCE.md, issue 15).
  python3 tools/tensorboard_check.py RUN_DIR/tensorboard [MORE_DIRS...]
"""
import sys

from tensorboard.backend.event_processing import event_accumulator

for d in sys.argv[1:]:
    ea = event_accumulator.EventAccumulator(d)
    ea.Reload()
    loss = ea.Scalars("lm loss")
    steps = [e.step for e in loss]
    print(d, "tags:", sorted(ea.Tags()["scalars"]))
    print(d, "lm loss: %d points, steps %s ... %s, first %.4f" % (len(loss), steps[:3], steps[-3:], loss[0].value))
