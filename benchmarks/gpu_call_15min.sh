#!/bin/bash
# A whole 15-minute lease of the `device` tool in one call (benchmarks/README.md): the most important figures first,
# each section given a deadline from the call's start, everything packed into $OUT/results.tgz after each section
# (one file comes back whatever stops the call). Run there as:  bash benchmarks/gpu_call_15min.sh   (carry: .whl)
# 2026-11-25 (H200) this took 550 s with the wheels' install; the machine's start is on top (about 30-90 s).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }  # seconds left until the section's deadline
R=/tmp/res; mkdir -p $R/runs
pack() {
  for f in /tmp/runs-*/*/results.json; do  # each run's whole record, named by its section's folder
    d=$(dirname "$f"); cp "$f" "$R/runs/$(basename $(dirname "$d"))-$(basename "$d").json"
  done
  tar czf "$OUT/results.tgz" -C /tmp res 2>/dev/null; echo "== packed at $(( $(date +%s) - T0 )) s"
}
suite() { local name=$1; shift
  bash benchmarks/gpu_session.sh suite --out $R/$name --runs_dir /tmp/runs-$name "$@" 2>&1 | tee $R/$name.log \
    | grep -E "^\[|failed|Error|^\|"; pack; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee $R/machine.txt
# 1. hfscale's ddp against the hand-written step at 350M, eager and compiled (the steady state since 2026-11-25),
#    and every step timed on its own (hfscale's per-step run; the hand-written loop's warm-up steps, with the SM clock):
#    where the one-off cost of steps 3-5 lies, and whether a loop without the Trainer pays it too (record.md, 2026-11-25)
suite a350 --only reference,runs --strategy ddp --optim adamw --ddp_variants compiled,per-step --steps 20 \
  --budget_s $(left 240)
# 2. at 1.3B compiled: the ratio, then MFU with the two levers measured apart on 2026-11-25 (MBS 16, vocabulary 50304)
#    together; then 1.3B eager if time is left
suite b13 --model gpt2-1.3b --only reference,runs --strategy ddp --optim adamw --references compiled --no-pairs \
  --ddp_variants compiled,mbs2x+vocab128 --steps 20 --budget_s $(left 470)
suite b13eager --model gpt2-1.3b --only reference,runs --strategy ddp --optim adamw --references eager \
  --ddp_variants none --steps 20 --budget_s $(left 490)
# 3. the CUDA grid without the KV cache, SDPA modes first (their fit still takes the cache off: FITTED_WITH_KV_CACHE)
suite grid --only grid --grid_filter '^gpt2/sdpa/[a-z0-9_]+/0$' --budget_s $(left 545)
