#!/bin/bash
# A short follow-up on the machine gpu_call_15min.sh (or gpu_call_strategies.sh) left warm, when 2-4 minutes of the
# lease are left (a warm machine keeps the installed wheels): the offload strategies' host threads, side by side.
# Run there as:  bash benchmarks/gpu_call_offload.sh   (carry: .whl, timeout_s what is left)
# hfscale's launcher gives each process its share of the node's CPUs (run/launcher.share_the_cpus); accelerate gave
# FSDP 1 thread (OMP_NUM_THREADS=1) and left DeepSpeed on every core. fsdp_offload's host AdamW with its share, then
# with accelerate's 1 thread (a user's OMP_NUM_THREADS stands), then zero2_offload's CPU Adam with its share.
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
suite offload --model gpt2-124m --only runs --strategy fsdp_offload --optim adamw --ddp_variants none --steps 12 \
  --budget_s $(left 60)
OMP_NUM_THREADS=1 suite offload1 --model gpt2-124m --only runs --strategy fsdp_offload --optim adamw \
  --ddp_variants none --steps 12 --budget_s $(left 110)
suite zoffload --model gpt2-124m --only runs --strategy zero2_offload --optim adamw --ddp_variants none --steps 12 \
  --budget_s $(left 170)
