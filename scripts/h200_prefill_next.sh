#!/usr/bin/env bash
# First H200 call for branch prefill-next (issue 13): the shared per-token walk (entries and pages
# loaded once, K/V through TMA on sm90, V after the softmax) in prefill and decode. Measures this
# tree against main over small config grids on the same inputs, then the GPU accuracy suite.
# `.before` beside the working tree, carried (`carry: [".before"]`):
#   git archive main | tar -x -C .before --exclude=tune_studies --exclude=results
#   bash scripts/h200_prefill_next.sh
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
timeout -k 10 300 python3 benchmarks/probe.py --kernel prefill --before .before --out "$OUT/prefill" \
  > "$OUT/prefill.log" 2>&1
grep -v "^compile " "$OUT/prefill.log" | tail -30
timeout -k 10 120 python3 benchmarks/probe.py --kernel decode --before .before --out "$OUT/decode" \
  --filter "tp1 scalar b128" "tp4 scalar b1 " "tp4 scalar b128" > "$OUT/decode.log" 2>&1
grep -v "^compile \|stream" "$OUT/decode.log" | tail -12
timeout -k 5 150 python3 -m pytest tests/gpu -q -n 12 -p no:cacheprovider --timeout 120 -W ignore --tb=line -rf \
  > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"
