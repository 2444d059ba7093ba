#!/bin/bash
# The first 15-minute lease of the `device` tool, in one call (benchmarks/gpu_lease.sh): what the last lease
# (results/h100_2026-11-26b) left unmeasured, the most important first.
# Run there as:  bash benchmarks/gpu_call_15min.sh   (carry: .whl, timeout_s 590)
# Sized from 2026-11-26 (H100): the wheels' install about 25 s; a compiled 350M reference 60 s and a 40-step compiled
# 350M run 60-65 s; a grid point 1-2 s. The machine's start is on top (about 30-90 s).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. 350M compiled is host-bound on an H100 (the hand-written step leaves the device idle 25% of its period) and hfscale
#    runs at 0.942 of it, a steady 3.6 ms per step over 35 steps. Which host work is it: the batches' collation and
#    pinning on the launching thread (workers2), or the kernels' launches (cudagraphs: CUDA graphs, none)?
suite a350host --only reference,runs --strategy ddp --optim adamw --references compiled --no-pairs \
  --ddp_variants compiled,workers2,cudagraphs --steps 40 --budget_s $(left 330)
# 2. ... or the Trainer's loop: one of hfscale's steps profiled the same way as the reference's of section 1
suite a350profile --only runs --strategy ddp --optim adamw --no-pairs --ddp_variants profile --steps 40 \
  --budget_s $(left 400)
# 3. the CUDA grid's compiled rows, 3 shapes per mode (COMPILED_ACTIVATION_FACTOR is one factor from two whole runs;
#    these make it one per mode): GPT-2 SDPA in fp32, autocast (as ddp --bf16 compiles it) and bf16
suite gridc --only grid --grid_filter '^gpt2/sdpa/[a-z0-9_]+/0 compiled$' --budget_s $(left 545)
