#!/usr/bin/env bash
# Hardware counters (Nsight Compute) for the decode rows that miss issue 12's targets, and the
# one-request chain on main and on branch decode-partials (carry [".partials"]:
#   rm -rf .partials && mkdir .partials && git archive decode-partials | tar -x -C .partials --exclude=tune_studies --exclude=results)
#   bash scripts/h200_profile.sh      # ~5 min on the H200
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
ncu --version | tail -1
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Chart --section WarpStateStats
 --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters"
CASES=('decode tp1 scalar b128 q1 ctx8k' 'decode tp1 scalar b128 q1 ctx8k={"kv_tma": 0}'
       'decode tp4 scalar b1 q1 ctx8k' 'decode tp4 scalar b1 q1 ctx8k={"kv_tma": 0}'
       'decode tp1 per_token_head b128 q1 ctx8k' 'decode tp4 scalar b128 q1 ctx8k={"kv_tma": 0}'
       'prefill tp1 scalar correlated 1x8k prefix0k=tiled')
timeout -k 10 300 ncu --clock-control none --profile-from-start off $SECTIONS -o "$OUT/profile" -f \
  python3 benchmarks/ncu_cases.py "${CASES[@]}" > "$OUT/ncu.log" 2>&1; echo "ncu rc=$?"; grep '^\[' "$OUT/ncu.log"
ncu -i "$OUT/profile.ncu-rep" --page details > "$OUT/profile.txt" 2>&1
grep -E '^  [^ ]|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Stall|Warp Cycles Per Issued' "$OUT/profile.txt" | head -120
for tree in . .partials; do
  tag=$([ $tree = . ] && echo main || echo partials)
  (cd $tree && timeout -k 10 120 python3 benchmarks/decode_chain.py --out "$OUT/chain_$tag" > "$OUT/chain_$tag.log" 2>&1)
  echo "chain $tag rc=$?"; cat "$OUT/chain_$tag.log" | tail -16
done
