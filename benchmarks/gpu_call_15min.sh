#!/bin/bash
# The first 15-minute lease of the `device` tool, in one call (benchmarks/gpu_lease.sh): what the last lease
# (results/h100_2026-11-26) left unmeasured, the most important first.
# Run there as:  bash benchmarks/gpu_call_15min.sh   (carry: .whl, timeout_s 590)
# Sized from 2026-11-26 (H100): the wheels' install about 25 s; a compiled 1.3B reference or run about 70 s, an eager
# one 30-50 s; a compiled 350M run 60-75 s; a grid point 1-2 s. The machine's start is on top (about 30-90 s).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. 1.3B compiled: the ratio again, then MFU with MBS 16 and the vocabulary padded to 50304 together (49.6% and 47.3%
#    apart on an H200; out of memory on 2026-11-26 beside the reference the suite's process still reserved, fixed since)
suite b13 --model gpt2-1.3b --only reference,runs --strategy ddp --optim adamw --references compiled --no-pairs \
  --ddp_variants compiled,mbs2x+vocab128 --steps 20 --budget_s $(left 230)
# 2. 1.3B eager against its hand-written step (the reference measured 27,070 tokens/s; the run ran out of memory)
suite b13eager --model gpt2-1.3b --only reference,runs --strategy ddp --optim adamw --references eager \
  --ddp_variants none --steps 20 --budget_s $(left 320)
# 3. 350M compiled over 40 steps: 0.945 over 15 steps on 2026-11-26 with one ~25 ms one-off in its last interval
suite a350 --only reference,runs --strategy ddp --optim adamw --references compiled --no-pairs \
  --ddp_variants compiled --steps 40 --budget_s $(left 420)
# 4. the CUDA grid's remaining unfolded modes: BLOOM eager (its fit is the CPU's but for autocast_bf16) and GPT-2 eager
#    fp32 with checkpointing (5 of 8 shapes so far)
suite grid --only grid --grid_filter '^(bloom/eager/[a-z0-9_]+/[01]|gpt2/eager/fp32/1)$' --budget_s $(left 545)
