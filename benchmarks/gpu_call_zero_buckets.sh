#!/bin/bash
# A 3-minute follow-up on the machine gpu_call_15min.sh left warm (call it within 30 s of the last call's end; a warm
# machine keeps the installed wheels): does DeepSpeed's own bucket size explain zero2 at 0.67 and zero3 at 0.32 of
# zero1 on one H100 (results/h100_2026-11-23)? Each with the shipped JSON ("auto": hidden^2 buckets, 195 reductions a
# step at 350M, docs/strategies.md) beside DeepSpeed's defaults (gpu_suite.ZERO_VARIANTS: 1 reduction a step). If the
# defaults are faster, the shipped JSONs take them, with these figures as the before/after.
# Run there as:  bash benchmarks/gpu_call_zero_buckets.sh   (carry: .whl, timeout_s what is left)
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
suite zero1base --only runs --strategy zero1 --optim adamw --ddp_variants none --steps 20 --budget_s $(left 40)
suite zero2buckets --only runs --strategy zero2 --optim adamw --ddp_variants none --steps 20 --budget_s $(left 100)
suite zero3buckets --only runs --strategy zero3 --optim adamw --ddp_variants none --steps 20 --budget_s $(left 200)
