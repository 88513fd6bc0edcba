#!/usr/bin/env bash
# The full default re-tune (issue 13: <= 20 min of one H200), resumable over device calls:
# `msa-tune` with its defaults (every table and bucket, leaders transfer, 40 trials, seeded from the
# shipped table), its studies in tune_studies/sm90__NVIDIA_H200.full.db (committed between sessions),
# written to tuned_configs/. Each call tunes for TUNE_S seconds and ends with the worker's time
# account; the re-tune's cost is the sum of the "msa-tune: N s =" lines of all its calls' logs:
#   grep -h "^msa-tune: [0-9]* s =" results/h200/<run>/call*/tune.log | awk '{s+=$2} END {print s}'
#   bash scripts/h200_full_retune.sh   (device `run`, carry [".whl"]; copy $OUT's files back after each call)
# scripts/h200_tune_sample.sh runs the same on one table of each kernel (GRID_ARGS, DB, OUT_ARGS).
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
DB=${DB:-$PWD/tune_studies/sm90__NVIDIA_H200.full.db}
start=$(date +%s)
timeout -k 10 $(( ${TUNE_S:-480} + 90 )) python3 tune.py ${GRID_ARGS:-} --storage "sqlite:///$DB" ${OUT_ARGS:-} \
  --time-budget "${TUNE_S:-480}" ${TUNE_ARGS:-} > "$OUT/tune.log" 2>&1
echo "tune rc=$? in $(( $(date +%s) - start )) s"
grep -v "trial #\|^msa-tune: wrote\|confirming\|^\[" "$OUT/tune.log" | tail -8
[ -z "${OUT_ARGS:-}" ] && cp tuned_configs/sm90__NVIDIA_H200.json "$OUT/"
gzip -c "$DB" > "$OUT/$(basename "$DB").gz"
