# Sourced by the benchmarks/gpu_call_*.sh scripts, each a whole 15-minute lease of the `device` tool in one call
# (benchmarks/README.md): sections of `suite NAME [gpu_suite.py arguments]`, each given a deadline from the call's
# start (--budget_s $(left SECONDS)), everything packed into $OUT/results.tgz after each section, so one file comes
# back whatever stops the call. tests/test_gpu_suite.py parses every section's arguments with gpu_suite.py's own parser.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
# seconds left until the section's deadline; with LEASE_S (the call's timeout_s, for a short call on a warm machine)
# no deadline falls within ITEM_S of it, the longest one item runs past its section's deadline (a 1.3B compiled run)
ITEM_S=120
left() { local deadline=$1
  if [ -n "$LEASE_S" ] && [ "$deadline" -gt $(( LEASE_S - ITEM_S )) ]; then deadline=$(( LEASE_S - ITEM_S )); fi
  echo $(( deadline - ($(date +%s) - T0) )); }
R=${RESULTS_DIR:-/tmp/res}; mkdir -p $R/runs  # what pack() sends back (RESULTS_DIR: elsewhere, for a test)
pack() {
  for f in /tmp/runs-*/*/results.json; do  # each run's whole record, named by its section's folder
    d=$(dirname "$f"); cp "$f" "$R/runs/$(basename $(dirname "$d"))-$(basename "$d").json"
  done
  tar czf "$OUT/results.tgz" -C "$(dirname $R)" "$(basename $R)" 2>/dev/null
  echo "== packed at $(( $(date +%s) - T0 )) s"
}
suite() { local name=$1; shift
  bash benchmarks/gpu_session.sh suite --out $R/$name --runs_dir /tmp/runs-$name "$@" 2>&1 | tee $R/$name.log \
    | grep --line-buffered -E "^\[|failed|Error|^\|"; pack; }  # each progress line as it comes
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee $R/machine.txt
