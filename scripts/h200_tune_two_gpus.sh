#!/usr/bin/env bash
# What produced results/h200/ on a 2 x H200 host (device tool kind nvidia-h200-x2), run from the repo
# root: the GPU accuracy tests on GPU 1 while GPU 0 starts tuning, then GPU 1 joins as a second
# worker on the same SQLite study (resumable: run it again to continue). Logs go to $OUT.
#   bash scripts/h200_tune_two_gpus.sh SECONDS   # tuning time budget per worker
set -uo pipefail
BUDGET=${1:?tuning seconds}
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TUNE=(python3 tune.py --trials 16 --bucket-time 20 --precompile-workers 14)
start=$(date +%s)
(
  if [ "${SKIP_GPU_TESTS:-0}" != 1 ]; then
    CUDA_VISIBLE_DEVICES=1 python3 -m pytest tests/gpu -q -n 6 -p no:cacheprovider --timeout 180 \
      > "$OUT/gpu_tests.log" 2>&1
    echo "rc=$?" >> "$OUT/gpu_tests.log"
  fi
  left=$(( BUDGET - ($(date +%s) - start) ))
  CUDA_VISIBLE_DEVICES=1 "${TUNE[@]}" --time-budget "$left" > "$OUT/tune_gpu1.log" 2>&1
) &
CUDA_VISIBLE_DEVICES=0 "${TUNE[@]}" --time-budget "$BUDGET" > "$OUT/tune_gpu0.log" 2>&1
wait
cp tuned_configs/sm90__NVIDIA_H200.json tune_studies/sm90__NVIDIA_H200.db "$OUT/" 2>/dev/null
tail -3 "$OUT/gpu_tests.log" 2>/dev/null
grep -h "msa-tune:" "$OUT"/tune_gpu*.log | tail -12
