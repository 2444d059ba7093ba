#!/bin/bash
# The Llama lease in one call (benchmarks/gpu_lease.sh), for an H100 (issue: the Llama family's GPU figures):
# llama-3.2-1b (tied head, 8 key/value heads for 32, a 128k vocabulary) on one GPU, bf16, compiled - its MFU against
# the datasheet, hfscale's step beside the hand-written one, the allocator's peak beside the estimate - then the CUDA
# activation grid of the Llama modes, which the estimate takes from the CPU fit until measured.
# Run there as:  bash benchmarks/gpu_call_llama.sh   (kind nvidia-h100-x1, carry: .whl, timeout_s 590)
# Sized from hfscale estimate (one H100, seq 2048, compiled: MBS 16 about 55 GB by the CPU activation fit) and from
# GPT-2 1.3B's compiled runs (about 100-115 s each with the install, results/h100_2026-11-27b/).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. MBS 8 compiled: hfscale against the hand-written loss-only step, MFU, the estimate against the allocator
suite llama1b --model llama-3.2-1b --seq_len 2048 --only reference,runs --strategy ddp --optim adamw --no-pairs \
  --references loss-only --ddp_variants compiled --steps 20 --budget_s $(left 200)
# 2. MBS 16, and the fused linear cross-entropy (a 128k vocabulary's logits are the step's largest tensors)
suite llama1b-more --model llama-3.2-1b --seq_len 2048 --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants mbs2x,flce --steps 20 --budget_s $(left 360)
# 3. the Llama grid (SDPA x fp32/autocast_bf16/bf16 x checkpointing, 10 shapes; the first 3 compiled too): the rows
#    calibrate_activations.py --fit turns into the CUDA coefficients
suite grid --only grid --grid_filter "^llama/" --budget_s $(left 540)
