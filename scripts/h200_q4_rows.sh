#!/usr/bin/env bash
# The decode rows the 512-token bucket changes (128 and 256 requests of 4 tokens: 512 and 1024
# tokens), before (.before, the previous main) and after, back to back per mode (carry [".before"]):
#   bash scripts/h200_q4_rows.sh      # ~2 min on the H200
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
for mode in scalar per_token_head none; do
  for side in after before; do
    tree=$([ $side = before ] && echo .before || echo .)
    (cd "$tree" && timeout -k 10 60 python3 benchmarks/bench.py --configs runtime --filter "$mode b128 q4" "$mode b256 q4" \
       --out "/tmp/q4_${side}_$mode" > "$OUT/q4_${side}_$mode.log" 2>&1); echo "$side $mode rc=$?"
    cp "/tmp/q4_${side}_$mode/bench.json" "$OUT/q4_${side}_$mode.json" 2>/dev/null
  done
done
python3 benchmarks/before_after.py --before "$OUT"/q4_before_*.json --after "$OUT"/q4_after_*.json 2>/dev/null | tail -40
