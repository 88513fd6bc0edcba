#!/usr/bin/env bash
# First H200 call for branch prefill-next (issue 13): the shared per-token walk (entries and pages
# loaded once, K/V through TMA on sm90, V after the softmax) in prefill and decode, and the tile
# plan. Measures this tree against main over small config grids on the same inputs.
# `.before` beside the working tree, carried (`carry: [".before"]`):
#   git archive main | tar -x -C .before --exclude=tune_studies --exclude=results
#   bash scripts/h200_prefill_next.sh
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
timeout -k 10 400 python3 benchmarks/probe.py --kernel prefill --before .before --out "$OUT/prefill" \
  --compile-jobs 14 > "$OUT/prefill.log" 2>&1
grep -v "^compile " "$OUT/prefill.log" | tail -30
timeout -k 10 120 python3 benchmarks/probe.py --kernel decode --before .before --out "$OUT/decode" \
  --compile-jobs 14 --filter "tp1 scalar b128" "tp4 scalar b1 " "tp4 scalar b128" > "$OUT/decode.log" 2>&1
grep -v "^compile \|stream" "$OUT/decode.log" | tail -12
