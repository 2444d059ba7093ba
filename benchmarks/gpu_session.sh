#!/bin/bash
# One call of the `device` tool on a GPU machine without a package registry (benchmarks/README.md):
#   bash benchmarks/gpu_session.sh suite  [gpu_suite.py arguments]    # e.g. --plan llama --out /tmp/res --pack $OUT/results.tgz
#   bash benchmarks/gpu_session.sh pytest [pytest arguments]          # the test suite on the GPU host
# The wheels carried in .whl/ are installed into $SITE once per fresh machine (60-80 s; a warm machine keeps them);
# without a .whl/ folder (a machine with the packages installed) nothing is installed. $PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
if [ -d .whl ] && [ ! -f "$SITE/.hfscale-installed" ]; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
  DS_BUILD_OPS=0 "$PYTHON" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" \
    .whl/deepspeed-*.tar.gz
  touch "$SITE/.hfscale-installed"
fi
[ -d .whl ] && export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
what=${1:-suite}
shift || true
case "$what" in
  suite)  exec "$PYTHON" benchmarks/gpu_suite.py "$@" ;;
  pytest) exec "$PYTHON" -m pytest "$@" ;;
  *) echo "gpu_session.sh: unknown command '$what' (valid: suite, pytest)" >&2; exit 2 ;;
esac
