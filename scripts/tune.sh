#!/usr/bin/env bash
# Sets up .venv and runs the main job: tune the MSA kernels on this machine's GPU into
# tuned_configs/ (arguments go to msa-tune). Without a GPU it runs the same pipeline on one tiny
# bucket under the Triton interpreter (msa-tune's smoke run, codegen/tuning/smoke.py), into a fresh
# temporary folder each time (a reused one would hold the finished study, so a second run would do
# nothing), removed when it ends; timings are meaningless there.
set -euo pipefail
cd "$(dirname "$0")/.."
MSA_TUNE_STATIC_VENV=0 bash scripts/setup.sh
if .venv/bin/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  exec .venv/bin/msa-tune "$@"
fi
SMOKE=$(mktemp -d "${TMPDIR:-/tmp}/msa-tune-smoke.XXXXXX")
trap 'rm -rf "$SMOKE"' EXIT
echo "msa-tune: no GPU visible; running the pipeline on one tiny bucket under the Triton interpreter, in $SMOKE (removed at the end)"
.venv/bin/msa-tune --interpret --arch sm90 --kernels decode --modes scalar:fp8 --layouts tp8 \
  --decode-buckets 2 --decode-context 300 --head-dim 32 --topk 4 --trials 4 \
  --out "$SMOKE" --storage "sqlite:///$SMOKE/study.db" "$@"
