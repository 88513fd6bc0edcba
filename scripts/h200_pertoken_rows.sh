#!/usr/bin/env bash
# Prefill's per-token walk with kv_upcast 3 against 2 (same config otherwise) on unrelated selections
# after a 120k prefix, and `auto` before (.before, the previous main) and after (carry [".before"]):
#   bash scripts/h200_pertoken_rows.sh     # ~1.5 min on the H200
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ROWS=("prefill tp1 scalar random 1x8k prefix120k" "prefill tp4 scalar random 1x8k prefix120k"
      "prefill tp4 per_token_head random 1x8k prefix120k")
for side in after before; do
  if [ $side = after ]; then tree=.; configs=(auto '{"block_t":1,"block_n":128,"kv_tma":0,"kv_upcast":3}'
                                               '{"block_t":1,"block_n":128,"kv_tma":0,"kv_upcast":2}')
  else tree=.before; configs=(auto); fi
  (cd $tree && timeout -k 5 80 python3 benchmarks/bench.py --filter "${ROWS[@]}" --configs "${configs[@]}" \
     --out "/tmp/pf_$side" > "$OUT/pf_$side.log" 2>&1); echo "pertoken rows $side rc=$?"
  cp "/tmp/pf_$side/bench.json" "$OUT/pf_$side.json" 2>/dev/null; grep '^prefill' "$OUT/pf_$side.log"
done
