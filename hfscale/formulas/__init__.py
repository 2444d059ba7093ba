"""Every figure hfscale reports or predicts, as pure functions with no torch at import: parameters, FLOPs,
throughput, MFU, days (metrics), device peaks (peaks), memory per rank (memory), bytes and time on the wire (comm)."""

# Named formulas, not numbers: a package called `numbers` inside hfscale/ would shadow Python's own `numbers` module
# whenever hfscale/train.py runs as a script (its folder is then first on sys.path).
