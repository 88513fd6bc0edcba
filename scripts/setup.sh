#!/usr/bin/env bash
# Creates .venv with the pinned CPU toolchain and installs msa-tune into it (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# torch first and pinned: an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/python -m pip install -q -r requirements-ci.txt
.venv/bin/python -m pip install -q --no-deps -e .
.venv/bin/python -c "import torch, triton, codegen; print(f'msa-tune ready: torch {torch.__version__}, triton {triton.__version__}')"
if [ "${MSA_TUNE_STATIC_VENV:-1}" = 1 ]; then
  # A second environment for the static resource gate, on the GPU image's Triton (requirements-static.txt).
  [ -x .venv-static/bin/python ] || "$PYTHON" -m venv .venv-static
  .venv-static/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv-static/bin/python -m pip install -q -r requirements-static.txt
  .venv-static/bin/python -m pip install -q --no-deps -e .
  .venv-static/bin/python -c "import triton; print(f'static gate ready: triton {triton.__version__}')"
fi
