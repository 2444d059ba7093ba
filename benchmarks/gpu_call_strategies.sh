#!/bin/bash
# The second 15-minute lease of the `device` tool, in one call (benchmarks/gpu_lease.sh), after gpu_call_15min.sh:
# what each strategy's step costs on one GPU and why (docs/strategies.md), then what each of ddp's GPU settings gives.
# Run there as:  bash benchmarks/gpu_call_strategies.sh   (carry: .whl, timeout_s 590)
# Sized from 2026-11-25 (H200): the wheels' install 60-80 s, an eager 350M run about 40 s, a compiled one about 60 s.
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. every strategy with AdamW at 350M, one step of each profiled (the busiest device ops, the device's idle share),
#    and zero2/zero3 beside their shipped JSONs (DeepSpeed's bucket sizes since h100_2026-11-26b) with the "auto"
#    buckets shipped before and a 5e7 reduce bucket (gpu_suite.ZERO_VARIANTS): where the rest of zero3's step goes
suite strategies --only runs --strategy ddp,zero1,zero2,zero3,fsdp --optim adamw --ddp_variants none --profile \
  --steps 20 --budget_s $(left 340)
# 2. ddp compiled with each GPU setting hfscale chose turned back (the Trainer's per-micro-batch syncs, Python's
#    automatic garbage collection) and the host syncs of one step named: what each setting gives
suite variants --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants trainer-syncs,gc0,host-syncs --steps 20 --budget_s $(left 480)
# 3. the 8-bit optimizers, profiled, if time is left: torchao's AdamW8bit on FSDP2's shards (0.35 of fsdp x adamw)
#    and bitsandbytes' under ddp (0.81)
suite eightbit --only runs --strategy ddp,fsdp --optim adamw_8bit --ddp_variants none --profile --steps 20 \
  --budget_s $(left 545)
