#!/usr/bin/env bash
# Second decode tuning pass on the H200 (issue 12): each table searches the configs that won any
# of its buckets in the previous main's table or in this change's first pass (plus, for TP1 fp8,
# the probe's best): scripts/h200_decode_candidates.json, every one measured on every bucket
# (--trials covers the longest list), in a fresh study database. Then the rows of the grid run
# that were slower than the previous main, and four headline rows, after and before in one call.
#   bash scripts/h200_decode_pass2.sh     (.before and .whl carried, as for h200_decode_run.sh)
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
DB=tune_studies/sm90__NVIDIA_H200_decode_pass2.db
timeout -k 10 "${TUNE_S:-240}" python3 tune.py --kernels decode --candidates @scripts/h200_decode_candidates.json \
  --trials 12 --precompile-workers 12 --storage "sqlite:///$PWD/$DB" > "$OUT/tune_pass2.log" 2>&1
echo "tune rc=$?"; tail -2 "$OUT/tune_pass2.log"
cp tuned_configs/sm90__NVIDIA_H200.json "$DB" "$OUT/"
mapfile -t LABELS < scripts/h200_decode_pass2_labels.txt
bench() {  # tree, name
  (cd "$1" && timeout -k 10 "${BENCH_S:-100}" python3 benchmarks/bench.py --configs runtime --filter "${LABELS[@]}" \
     --out "/tmp/bench_$2" > "$OUT/bench_$2.log" 2>&1)
  cp "/tmp/bench_$2/bench.json" "$OUT/bench_$2.json" 2>/dev/null
}
bench . after_pass2
bench .before before_pass2
