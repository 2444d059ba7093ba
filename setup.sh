#!/usr/bin/env bash
# Set up hfscale in ./.venv. torch is installed FIRST and pinned: letting a resolver pick torch freely would pull the
# multi-GB CUDA build onto a CPU machine. On a GPU machine set TORCH_SPEC to the CUDA build you want.
# torch comes from pip (where a machine keeps its local torch wheels); the rest from uv (52 s in all, pip's 64 s;
# HFSCALE_INSTALLER=pip: pip only). Both compile the bytecode at install: where PYTHONDONTWRITEBYTECODE is set (as on CI)
# Python never writes it, and every process of every run would compile transformers, DeepSpeed, ... from source again
# (fresh-clone CI took 1710 s so, 1139 s with it).
set -euo pipefail
cd "$(dirname "$0")"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
[ -x .venv/bin/python ] || python3 -m venv .venv
PIP=(.venv/bin/python -m pip -q --disable-pip-version-check)
quiet() { grep -v "is ignored" || true; }  # pip's notes about index locations this machine does not have
"${PIP[@]}" install --upgrade pip setuptools wheel 2>&1 | quiet
.venv/bin/python -c "import torch" 2>/dev/null || "${PIP[@]}" install "$TORCH_SPEC" 2>&1 | quiet
# --no-build-isolation: DeepSpeed's build imports torch; an isolated build env would fetch its own (CUDA) torch.
# With torch already installed, the ranges in pyproject.toml install no other torch.
if [ "${HFSCALE_INSTALLER:-uv}" = uv ] && "${PIP[@]}" install uv 2>&1 | quiet && [ -x .venv/bin/uv ]; then
  .venv/bin/uv pip install -q --python .venv/bin/python --no-build-isolation --compile-bytecode -e ".[test]"
else
  "${PIP[@]}" install --no-build-isolation -e ".[test]" 2>&1 | quiet
fi
# hfscale itself is installed editable, so neither installer compiled it: ~0.1 CPU-s per process that imports it
.venv/bin/python -m compileall -q hfscale
.venv/bin/python -c "import torch, hfscale; print(f'hfscale ready: torch {torch.__version__}, cuda={torch.cuda.is_available()}')"
