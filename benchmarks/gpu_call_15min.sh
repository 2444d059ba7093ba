#!/bin/bash
# The first 15-minute lease of the `device` tool, in one call (benchmarks/gpu_lease.sh): hfscale's speed against the
# hand-written step, MFU at 1.3B and the CUDA grid, the most important first.
# Run there as:  bash benchmarks/gpu_call_15min.sh   (carry: .whl, timeout_s 590)
# 2026-11-25 (H200) this took 550 s with the wheels' install; the machine's start is on top (about 30-90 s).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. hfscale's ddp against the hand-written step at 350M, eager and compiled (the steady state since 2026-11-25),
#    and every step timed on its own (hfscale's per-step run; the hand-written loop's warm-up steps, with the SM clock):
#    where the one-off cost of steps 3-5 lies, and whether a loop without the Trainer pays it too (record.md, 2026-11-25)
suite a350 --only reference,runs --strategy ddp --optim adamw --ddp_variants compiled,per-step --steps 20 \
  --budget_s $(left 240)
# 2. at 1.3B compiled: the ratio, then MFU with the two levers measured apart on 2026-11-25 (MBS 16, vocabulary 50304)
#    together; then 1.3B eager if time is left
suite b13 --model gpt2-1.3b --only reference,runs --strategy ddp --optim adamw --references compiled --no-pairs \
  --ddp_variants compiled,mbs2x+vocab128 --steps 20 --budget_s $(left 470)
suite b13eager --model gpt2-1.3b --only reference,runs --strategy ddp --optim adamw --references eager \
  --ddp_variants none --steps 20 --budget_s $(left 490)
# 3. the CUDA grid without the KV cache, SDPA modes first (their fit still takes the cache off: FITTED_WITH_KV_CACHE)
suite grid --only grid --grid_filter '^gpt2/sdpa/[a-z0-9_]+/0$' --budget_s $(left 545)
