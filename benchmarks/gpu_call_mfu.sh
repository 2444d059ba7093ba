#!/bin/bash
# The MFU lease in one call (benchmarks/gpu_lease.sh), for an H100: the 1.3B step at 50% of the 989 TFLOPs datasheet.
# GPT-2 1.3B compiled, MBS 16, the vocabulary padded to 50304, the loss-only forward ran 48.3% on an H100 and 51.3% on
# an H200 (results/h100_2026-11-27/, h200_2026-11-27/); the H100 runs that step at its power limit (1725-1800 MHz).
# Run there as:  bash benchmarks/gpu_call_mfu.sh   (kind nvidia-h100-x1, carry: .whl, timeout_s 590)
# Each run records the SM clock at every logging interval (perf_history's sm_mhz; gpu_suite.md lists them): whether
# the step ran at the power-limited clock the 48.3% was put down to.
# Sized from 2026-11-27 (H100): the wheels' install about 25 s, a 1.3B compiled run at MBS 16 about 100 s; at MBS 24
# about 1.5x its steps; inductor's autotuning adds its benchmarks of every matmul shape to the compilation (untimed).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. the 48.3% run again, the baseline of this call
suite base --model gpt2-1.3b --only runs --strategy ddp --optim adamw --no-pairs --ddp_variants mbs2x+vocab128 \
  --steps 20 --budget_s $(left 150)
# 2. the same with inductor's matmul autotuning (max-autotune-no-cudagraphs)
suite autotune --model gpt2-1.3b --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants mbs2x+vocab128+autotune --steps 20 --budget_s $(left 330)
# 3. three times the first micro-batch (MBS 24, padded): 16 over 8 gave 1.07x; the estimate says it fits in 80 GB
suite mbs24 --model gpt2-1.3b --per_device_train_batch_size 12 --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants mbs2x+vocab128 --steps 20 --budget_s $(left 470)
