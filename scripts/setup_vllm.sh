#!/usr/bin/env bash
# Creates .venv-vllm for the vLLM plugin test (tests/vllm): vLLM 0.33.0 and the few packages its
# MiniMax-M3 attention modules import, on the CPU torch, all pinned in requirements-vllm.txt and
# installed with --no-deps (vLLM's own requirements would pull a CUDA torch and torchvision).
# A complete environment (its stamp matches the requirements file) is kept: only msa-tune is
# reinstalled, so its entry point follows pyproject.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
stamp="$VENV/.msa-tune-requirements"
want=$(sha256sum < requirements-vllm.txt | cut -d' ' -f1)
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --no-deps -r requirements-vllm.txt
  echo "$want" > "$stamp"  # written last: an interrupted install is redone next time
fi
"$VENV/bin/python" -m pip install -q --no-deps -e .
# Versions from the metadata: importing vllm takes seconds, the tests do that.
"$VENV/bin/python" -c "from importlib.metadata import version as v; \
print(f'vllm plugin test ready: vllm {v(\"vllm\")}, torch {v(\"torch\")}, msa-tune {v(\"msa-tune\")}')"
