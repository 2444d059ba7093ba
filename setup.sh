#!/usr/bin/env bash
# Set up hfscale in ./.venv. torch is installed FIRST and pinned: letting pip resolve torch freely would pull the
# multi-GB CUDA build onto a CPU machine. On a GPU machine set TORCH_SPEC to the CUDA build you want.
set -euo pipefail
cd "$(dirname "$0")"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
"${PIP[@]}" install --upgrade pip setuptools wheel 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" install "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
# --no-build-isolation: DeepSpeed's build imports torch; an isolated build env would fetch its own (CUDA) torch.
"${PIP[@]}" install --no-build-isolation -e ".[test]" 2>&1 | grep -v "is ignored" || true
.venv/bin/python -c "import torch, hfscale; print(f'hfscale ready: torch {torch.__version__}, cuda={torch.cuda.is_available()}')"
