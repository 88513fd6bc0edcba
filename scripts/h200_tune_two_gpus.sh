#!/usr/bin/env bash
# What produced results/h200/ on a 2 x H200 host (device tool kind nvidia-h200-x2), run from the repo
# root. GPU 1: the GPU accuracy tests, then a tuning worker; GPU 0: a tuning worker, then the
# headline benchmark with the configs just tuned. Workers share one SQLite study (resumable: run
# again to continue). Every phase has its own time limit, so logs, study and JSON always reach $OUT.
#   TUNE0_ARGS="--kernels decode" TUNE1_ARGS="--kernels prefill" BENCH_CONFIGS="runtime untuned" \
#     bash scripts/h200_tune_two_gpus.sh TUNE_SECONDS BENCH_SECONDS TEST_SECONDS
# The next run: bash scripts/h200_tune_two_gpus.sh 420 170 120  (finishes the grid, then the
# benchmark with the unfolded column; carry .whl, the study travels in the tree).
set -uo pipefail
TUNE_S=${1:?tuning seconds}; BENCH_S=${2:-0}; TEST_S=${3:-300}
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# The CPU reference and Triton's compiles run in many processes at once: without this every torch
# process starts one thread per core and they thrash (a 25 s test suite took over 10 minutes).
export OMP_NUM_THREADS=2
TUNE=(python3 tune.py --trials 16 --bucket-time 20 --precompile-workers 12)
start=$(date +%s)
tune() {  # GPU, seconds, extra args
  [ "$2" -gt 30 ] || return 0
  CUDA_VISIBLE_DEVICES=$1 timeout -k 10 $(( $2 + 60 )) "${TUNE[@]}" --time-budget "$2" $3 >> "$OUT/tune_gpu$1.log" 2>&1
}
(
  # -v: each test's verdict is in the log as it finishes; SIGINT at the limit still prints the summary.
  CUDA_VISIBLE_DEVICES=1 timeout -s INT "$TEST_S" python3 -m pytest tests/gpu -v -n 12 -p no:cacheprovider \
    --timeout 120 --tb=line -rf -W ignore > "$OUT/gpu_tests.log" 2>&1
  echo "rc=$?" >> "$OUT/gpu_tests.log"
  tune 1 $(( TUNE_S + BENCH_S - ($(date +%s) - start) )) "${TUNE1_ARGS:-}"
) &
tune 0 "$TUNE_S" "${TUNE0_ARGS:-}"
if [ "$BENCH_S" -gt 0 ]; then
  # shellcheck disable=SC2086 - BENCH_CONFIGS is a word list
  CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$BENCH_S" python3 benchmarks/bench.py --quick \
    --configs ${BENCH_CONFIGS:-runtime untuned unfolded} --out "$OUT/bench" > "$OUT/bench.log" 2>&1
fi
wait
cp tuned_configs/sm90__NVIDIA_H200.json tune_studies/sm90__NVIDIA_H200.db "$OUT/"
grep -E "passed|failed|rc=" "$OUT/gpu_tests.log" | tail -3
grep -hE "msa-tune: .*(s =|worker)|buckets in" "$OUT"/tune_gpu*.log | tail -6
