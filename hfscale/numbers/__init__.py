"""Every figure hfscale reports or predicts, as pure functions with no torch at import: parameters, FLOPs,
throughput, MFU, days (metrics), device peaks (peaks), memory per rank (memory), bytes and time on the wire (comm)."""
