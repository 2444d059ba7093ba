#!/bin/bash
# The Llama lease in one call (benchmarks/gpu_lease.sh), for an H100 (issue: the Llama family's GPU figures):
# llama-3.2-1b (tied head, 8 key/value heads for 32, a 128k vocabulary) on one GPU, bf16, compiled - its MFU against
# the datasheet, hfscale's step beside the hand-written one, the allocator's peak beside the estimate - then the CUDA
# activation grid of the Llama modes, which the estimate takes from the CPU fit until measured.
# Run there as:  bash benchmarks/gpu_call_llama.sh   (kind nvidia-h100-x1, carry: .whl, timeout_s 590)
# Ran on an H200 on 2026-11-28 (results/h200_2026-11-28/record.md); the MFU goal is an H100's.
# Sized from hfscale estimate (one H100, seq 2048, compiled: MBS 16 about 55 GB by the CPU activation fit) and from
# GPT-2 1.3B's compiled runs (about 100-115 s each with the install, results/h100_2026-11-27b/).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. MBS 8 compiled: hfscale against the hand-written loss-only step, MFU, the estimate against the allocator
suite llama1b --model llama-3.2-1b --seq_len 2048 --only reference,runs --strategy ddp --optim adamw --no-pairs \
  --references loss-only --ddp_variants compiled --steps 20 --budget_s $(left 200)
# 2. MBS 16 (the fused linear cross-entropy, measured on an H200 on 2026-11-28, left out: it let section 3 no time)
suite llama1b-more --model llama-3.2-1b --seq_len 2048 --only runs --strategy ddp --optim adamw --no-pairs \
  --ddp_variants mbs2x --steps 20 --budget_s $(left 330)
# 3. float8 (issue: FP8 training) per linear layer of the presets' blocks, compiled, against bf16: where FP8 pays
PYTHONPATH=/tmp/site:$PWD timeout $(left 440) python3 benchmarks/fp8_matmul.py --out $R/fp8_matmul.json \
  --budget_s $(left 400) 2>&1 | tee $R/fp8_matmul.log | grep -v Warning; pack
# 4. the Llama grid (SDPA x fp32/autocast_bf16/bf16 x checkpointing, 10 shapes; the first 3 compiled too): the rows
#    calibrate_activations.py --fit turns into the CUDA coefficients
suite grid --only grid --grid_filter "^llama/" --budget_s $(left 540)
