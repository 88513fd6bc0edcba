#!/usr/bin/env bash
# One H200 call: the default search (leaders transfer, 40 trials) on one table of each kernel
# (TP4, scalar, fp8: 14 prefill studies, 10 decode), from a fresh study database, with the trials'
# time account by phase. The default grid is 9 such tables of each kernel, so the run's time x 9 is
# what a full default re-tune would take (issue 13: <= 20 min asked).
#   bash scripts/h200_tune_sample.sh        (device `run`, carry [".whl"]; TUNE_S seconds of tuning)
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
start=$(date +%s)
timeout -k 10 $(( ${TUNE_S:-430} + 90 )) python3 tune.py --layouts tp4 --modes scalar:fp8 \
  --storage sqlite:////tmp/sample.db --out "$OUT/cfg" --time-budget "${TUNE_S:-430}" ${TUNE_ARGS:-} > "$OUT/tune.log" 2>&1
echo "tune rc=$? in $(( $(date +%s) - start )) s"
grep -v "trial #\|^msa-tune: wrote\|confirming\|^\[" "$OUT/tune.log" | tail -8
gzip -c /tmp/sample.db > "$OUT/sample.db.gz"
