#!/bin/bash
# A 15-minute lease of the `device` tool, in one call (benchmarks/gpu_lease.sh): the loss-only forward's speed and
# memory. Measured on an H200 (results/h200_2026-11-27: 1.004 of the hand-written step, 51.3% MFU) and an H100
# (results/h100_2026-11-27: 0.991, 48.3%) on 2026-11-27. The next leases: gpu_call_strategies.sh, gpu_call_mfu.sh.
# Run there as:  bash benchmarks/gpu_call_15min.sh   (carry: .whl, timeout_s 590)
# Sized from 2026-11-27 (H200): 476 s in all; the wheels' install about 25 s; a compiled 350M reference 40-70 s (each)
# and a 40-step compiled 350M run 45-85 s; a 1.3B compiled run about 85 s; a compiled grid point 9-25 s. The machine's
# start is on top (about 30 s).
source "$(dirname "$0")/gpu_lease.sh"  # left, suite, pack
# 1. 350M compiled ran at 0.948 of the hand-written step on an H200 because its step returned the b x s x V logits
#    (accelerate converted them to fp32; torch.compile gave the unused output a zero gradient the backward read: 2.1 ms
#    more device time). The training forward returns the loss alone since: the ratio now, to the hand-written step as
#    a user writes it with the HF model (its logits returned) and to the same step with hfscale's forward (loss-only:
#    the ratio that is the Trainer's and hfscale's own cost), and one of hfscale's steps profiled
suite a350 --only reference,runs --strategy ddp --optim adamw --references compiled,loss-only --no-pairs \
  --ddp_variants compiled,profile --steps 40 --budget_s $(left 300)
# 2. 1.3B compiled with both MFU levers (MBS 16, the vocabulary padded to 50304): 47.6% on an H100 and 49.6% on an
#    H200 (MBS 16 alone) with the logits returned; the goal is 50%
suite b13 --model gpt2-1.3b --only runs --strategy ddp --optim adamw --no-pairs --ddp_variants mbs2x+vocab128 \
  --steps 20 --budget_s $(left 410)
# 3. the compiled grid rows of the loss-only step ("logits_output": false), 3 shapes per mode: on CPU its peak above
#    what it keeps fell from 4.0 to 0.25 bytes per logit (autocast), from 8.0 to 0.34 (fp32); activations.py's compiled
#    figures (measured with the logits returned) stand as an upper bound until these rows are fitted apart (their
#    "loss_only" entries: benchmarks/README.md)
suite gridc --only grid --grid_filter '^gpt2/sdpa/[a-z0-9_]+/0 compiled$' --budget_s $(left 545)
