#!/usr/bin/env bash
# Prefill grid before/after on the H200 (issue 13), one call: this tree's kernels and re-tuned table
# against the previous main (.before, carried) on the same inputs, then the GPU accuracy suite.
#   bash scripts/h200_prefill_grid.sh       (carry: [".before"])
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
FILTER=("prefill" )
[ -n "${PREFILL_FILTER:-}" ] && read -ra FILTER <<< "$PREFILL_FILTER"
bench() {  # tree, name, seconds
  (cd "$1" && timeout -k 10 "$3" python3 benchmarks/bench.py --configs runtime --filter "${FILTER[@]}" \
     --out "/tmp/bench_$2" > "$OUT/bench_$2.log" 2>&1)
  echo "bench $2 rc=$?"; cp "/tmp/bench_$2/bench.json" "$OUT/bench_$2.json" 2>/dev/null
}
bench . after "${BENCH_S:-170}"
bench .before before "${BENCH_S:-170}"
[ "${TESTS_S:-150}" = 0 ] && exit 0  # TESTS_S=0: the grid only (a caller runs its own tests)
timeout -k 5 "${TESTS_S:-150}" python3 -m pytest tests/gpu -q -n 12 -p no:cacheprovider --timeout 120 -W ignore \
  --tb=line -rf > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$?"; tail -4 "$OUT/gpu_tests.log"
