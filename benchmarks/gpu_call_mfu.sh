#!/bin/bash
# The MFU lease in one call (benchmarks/gpu_lease.sh), second version, for an H100: what inductor's matmul autotuning
# adds to the 1.3B step. GPT-2 1.3B compiled, the vocabulary padded to 50304, the loss-only forward: 49.1% MFU at
# MBS 16 and 50.6% at MBS 24 on an H100 (results/h100_2026-11-27b/). The first version's autotuning run failed at its
# first compiled step (torch refused inductor's read of the legacy matmul precision after transformers set TF32
# through the new API); hfscale restates the precision since (parallel/distributed.restate_matmul_precision).
# Run there as:  bash benchmarks/gpu_call_mfu.sh   (kind nvidia-h100-x1, carry: .whl, timeout_s 590)
# Each run records the SM clock at every logging interval (perf_history's sm_mhz; gpu_suite.md lists them).
# Sized from 2026-11-27b (H100): the wheels' install about 25 s, a 1.3B compiled run at MBS 16 about 115 s with the
# install, at MBS 24 about 100 s; autotuning adds its benchmarks of every matmul shape to the compilation (untimed).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. MBS 24, the 50.6% run again: the baseline of this call
suite mbs24 --model gpt2-1.3b --per_device_train_batch_size 12 --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants mbs2x+vocab128 --steps 20 --budget_s $(left 150)
# 2. the same with inductor's matmul autotuning (max-autotune-no-cudagraphs)
suite autotune24 --model gpt2-1.3b --per_device_train_batch_size 12 --only runs --strategy ddp --optim adamw \
  --no-pairs --ddp_variants mbs2x+vocab128+autotune --steps 20 --budget_s $(left 300)
# 3. autotuning at MBS 16, beside the 49.1% of 2026-11-27b, should MBS 24's autotuning need more memory than it has
suite autotune16 --model gpt2-1.3b --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants mbs2x+vocab128+autotune --steps 20 --budget_s $(left 450)
