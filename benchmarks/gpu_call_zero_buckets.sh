#!/bin/bash
# A 4-5-minute follow-up on the machine gpu_call_15min.sh left warm (call it within 30 s of the last call's end; a warm
# machine keeps the installed wheels). zero2.json and zero3.json ship DeepSpeed's bucket sizes since 2026-11-26 (5e8
# reduce bucket: zero2 1.34x and zero3 1.57x faster than transformers' "auto" on one H100, results/h100_2026-11-26b).
# Each strategy runs with the shipped JSON beside gpu_suite.ZERO_VARIANTS: "auto-buckets" (the values before, the
# before/after again) and "5e7-buckets" (8 reductions a step at 350M, which several GPUs could overlap with the
# backward, and 0.2 GB of buckets against 2 GB): is the middle ground as fast on one GPU? (One H200, 2026-11-26:
# for zero2 yes, 53,327 against 53,649 tokens/s; for zero3 no, 26,384 against 36,359: results/h200_2026-11-26.)
# Run there as:  bash benchmarks/gpu_call_zero_buckets.sh   (carry: .whl, timeout_s what is left)
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
suite zero1base --only runs --strategy zero1 --optim adamw --ddp_variants none --steps 20 --budget_s $(left 40)
suite zero2buckets --only runs --strategy zero2 --optim adamw --ddp_variants none --steps 20 --budget_s $(left 140)
suite zero3buckets --only runs --strategy zero3 --optim adamw --ddp_variants none --steps 20 --budget_s $(left 260)
