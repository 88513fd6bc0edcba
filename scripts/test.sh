#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh) and runs every CPU gate. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export OMP_NUM_THREADS=1
PY=.venv/bin/python
echo "== drift: generated modules vs templates"
$PY -m codegen render --check
echo "== interpreter suite (TRITON_INTERPRET=1, fp32 queries)"
$PY -m pytest -q -n 2 tests/interp
if [ -n "${MSA_TUNE_TEST_PG_URL:-}" ]; then
  # .ci/run starts the server (scripts/postgres.sh) and sets the URL; without it these tests are skipped.
  echo "== shared studies on PostgreSQL: tune.py workers on one database, one killed, one losing it"
  $PY -m pytest -q -n 2 tests/postgres
else
  echo "== SKIPPED tests/postgres (tune.py workers sharing one PostgreSQL study): MSA_TUNE_TEST_PG_URL is not set." \
       "To run them: .ci/run (starts a throwaway server; installs Debian's postgresql as root if missing)," \
       "or MSA_TUNE_TEST_PG_URL=postgresql+psycopg://USER@HOST/DB bash scripts/test.sh"
fi
if [ -d tests/static ]; then
  echo "== static compile gates (sm90 + gfx942, ahead of time, on the GPU image's triton; no interpreter)"
  .venv-static/bin/python -m pytest -q -n 2 tests/static
fi
if [ "${MSA_TUNE_VLLM_VENV:-1}" = 1 ]; then
  # Its own environment (.venv-vllm: vLLM 0.33.0 without its GPU dependencies), set up here rather than
  # in setup.sh so that tune.sh on a GPU machine never builds it; kept between runs once complete.
  echo "== vLLM plugin: loaded by vLLM 0.33.0's load_general_plugins, calls through vLLM's modules (interpreter)"
  bash scripts/setup_vllm.sh
  .venv-vllm/bin/python -m pytest -q tests/vllm
else
  echo "== SKIPPED tests/vllm: MSA_TUNE_VLLM_VENV=${MSA_TUNE_VLLM_VENV}; unset it to run them"
fi
