#!/bin/bash
# A short follow-up on a warm machine (benchmarks/gpu_lease.sh): the loss-only step's compiled grid rows at the
# larger shapes of the whole runs. On 2026-11-27 (results/h200_2026-11-27) the whole loss-only runs (350M MBS 8, 1.3B
# MBS 16) peaked 4 bytes per logit below the same runs returning their logits, where the grid's rows (4-8 layers, MBS
# 4) fell 2, and the estimate stands 7-8.5% over those runs: these rows say which shapes make the difference.
# Run there as:  LEASE_S=N bash benchmarks/gpu_call_loss_only_grid.sh   (carry: .whl, timeout_s N, what is left)
# Sized from 2026-11-27 (H200): a compiled grid point 9-25 s; two shapes per mode.
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. autocast_bf16 (ddp's --bf16, the most common), 2. bf16 (DeepSpeed's and FSDP's), 3. fp32; 8 layers, MBS 8 and 16
suite gridl_autocast --only grid --grid_shapes 8x1024x16x50257x1024x8,8x1024x16x50257x1024x16 \
  --grid_filter '^gpt2/sdpa/autocast_bf16/0 compiled$' --budget_s $(left 150)
suite gridl_bf16 --only grid --grid_shapes 8x1024x16x50257x1024x8,8x1024x16x50257x1024x16 \
  --grid_filter '^gpt2/sdpa/bf16/0 compiled$' --budget_s $(left 250)
suite gridl_fp32 --only grid --grid_shapes 8x1024x16x50257x1024x8,8x1024x16x50257x1024x16 \
  --grid_filter '^gpt2/sdpa/fp32/0 compiled$' --budget_s $(left 350)
