#!/usr/bin/env bash
# Hardware counters (Nsight Compute) for the decode rows that miss issue 12's targets (the runtime's
# tuned configs; NCU_CASES for others), and optionally the one-request chain on main and on another tree (carry it, e.g.
#   rm -rf .partials && mkdir .partials && git archive decode-partials | tar -x -C .partials --exclude=tune_studies --exclude=results)
#   bash scripts/h200_profile.sh [TREE]     # ~1 min, ~2 with a tree
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ncu --version | tail -1
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart --section WarpStateStats
 --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters"
CASES=('decode tp1 scalar b128 q1 ctx8k' 'decode tp1 per_token_head b128 q1 ctx8k' 'decode tp4 scalar b128 q1 ctx8k'
       'decode tp8 scalar b256 q1 ctx128k' 'decode tp4 scalar b1 q1 ctx8k' 'decode tp4 scalar b8 q1 ctx8k')
# NCU_CASES (one CASE[=CONFIG] a line, as benchmarks/ncu_cases.py takes them) replaces that list.
[ -n "${NCU_CASES:-}" ] && mapfile -t CASES <<< "$NCU_CASES"
timeout -k 10 300 ncu --clock-control none --profile-from-start off $SECTIONS -o "$OUT/profile" -f \
  python3 benchmarks/ncu_cases.py "${CASES[@]}" > "$OUT/ncu.log" 2>&1; echo "ncu rc=$?"; grep '^\[' "$OUT/ncu.log"
ncu -i "$OUT/profile.ncu-rep" --page details > "$OUT/profile.txt" 2>&1
grep -E '^  [^ ]|Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Eligible Warps' "$OUT/profile.txt" | head -80
[ $# -ge 1 ] || exit 0
for tree in . "$1"; do
  tag=$([ "$tree" = . ] && echo main || basename "$tree")
  (cd $tree && timeout -k 10 120 python3 benchmarks/decode_chain.py --out "$OUT/chain_$tag" > "$OUT/chain_$tag.log" 2>&1)
  echo "chain $tag rc=$?"; cat "$OUT/chain_$tag.log" | tail -16
done
