#!/bin/bash
# The strategies' lease in one call (benchmarks/gpu_lease.sh), third version: what the first two left to measure. The
# first (one H200, 2026-11-27: benchmarks/results/h200_2026-11-27b/) profiled every strategy's step at 350M, zero2
# with the other buckets and ddp with bitsandbytes' 8-bit AdamW; the second (one H100, a short call: h100_2026-11-27/)
# timed ddp compiled with the Trainer's syncs put back beside hfscale's defaults (1.106x) and with --gc_freq 0.
# Run there as:  bash benchmarks/gpu_call_strategies.sh   (carry: .whl, timeout_s 590)
# Sized from 2026-11-27 (H200): the wheels' install 25-80 s, an eager 350M run about 50 s, a profiled one about 60 s.
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. fsdp with torchao's AdamW8bit beside fsdp with AdamW, one step of each profiled (0.37 of it on an H100; the first
#    version's limit stopped it)
suite eightbit --only runs --strategy fsdp --optim adamw,adamw_8bit --ddp_variants none --profile --steps 20 \
  --budget_s $(left 180)
# 2. zero1, zero2 and zero3 again, unprofiled, 30 steps: their steps wait on the host's Python (the device idle 31-77%
#    of a step), and two H200 leases disagreed (zero3 0.225 and 0.385 s/it): how much of a ZeRO step's speed is the host
suite zero --only runs --strategy zero1,zero2,zero3 --optim adamw --zero_variants none --ddp_variants none \
  --steps 30 --budget_s $(left 400)
# 3. the host syncs of one eager ddp step, named (--count_host_syncs)
suite syncs --only runs --strategy ddp --optim adamw --no-pairs --ddp_variants host-syncs --steps 20 \
  --budget_s $(left 470)
