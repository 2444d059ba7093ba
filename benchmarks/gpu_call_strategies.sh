#!/bin/bash
# The strategies' lease in one call (benchmarks/gpu_lease.sh), second version: what its first left to measure. The
# first (one H200, 2026-11-27: benchmarks/results/h200_2026-11-27b/) profiled every strategy's step at 350M, zero2
# with the other buckets, ddp with bitsandbytes' 8-bit AdamW, and ddp compiled with the Trainer's syncs put back.
# Run there as:  bash benchmarks/gpu_call_strategies.sh   (carry: .whl, timeout_s 590)
# Sized from 2026-11-27 (H200): the wheels' install 60-80 s, an eager 350M run about 50 s, a compiled one about 60-90 s.
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. ddp compiled with hfscale's defaults beside the same with the Trainer's per-micro-batch syncs put back and with
#    Python's automatic garbage collection (--gc_freq 0), in one call: the first version measured the syncs alone
#    (0.0662 s/it, where the default ran 0.0547 on the lease before); then the host syncs of one step named
suite variants --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants compiled,trainer-syncs,gc0,host-syncs --steps 20 --budget_s $(left 260)
# 2. fsdp with torchao's AdamW8bit beside fsdp with AdamW, one step of each profiled (0.35 of it on an H100; the first
#    version's limit stopped it)
suite eightbit --only runs --strategy fsdp --optim adamw,adamw_8bit --ddp_variants none --profile --steps 20 \
  --budget_s $(left 400)
# 3. zero1, zero2 and zero3 again, unprofiled, 30 steps: their steps wait on the host's Python (the device idle 31-77%
#    of a step), and two H200 leases disagreed (zero3 0.225 and 0.385 s/it): how much of a ZeRO step's speed is the host
suite zero --only runs --strategy zero1,zero2,zero3 --optim adamw --zero_variants none --ddp_variants none \
  --steps 30 --budget_s $(left 470)
