#!/usr/bin/env bash
# One H200 call for what the 2026-12-01 (third) session left unmeasured (issue 13), ~8 minutes:
#   1. selection="auto" with the one-launch decision (this tree) against the torch estimate it replaced
#      (.before = the measured commit b66bb67), tiled-only and auto side by side on the same rows;
#   2. the GPU tests of the decision kernel and of auto in a CUDA graph;
#   3. the kv_tma knob (docs/leads/kv-tma-knob.patch, tree .kvtma): the per-token walk with TMA and
#      with plain loads on the unrelated-selection rows, bf16 and fp8;
#   4. the inverted-loop prototype (docs/leads/inverted-prefill.patch, tree .inverted) at TP1.
# Make the trees here, then carry them: carry [".before", ".kvtma", ".inverted"]:
#   for t in before kvtma inverted; do rm -rf .$t; mkdir .$t; done
#   git archive b66bb67 | tar -x -C .before --exclude=tune_studies --exclude=results
#   for t in kvtma inverted; do git archive HEAD | tar -x -C .$t --exclude=tune_studies --exclude=results; done
#   (cd .kvtma && patch -s -p1 < ../docs/leads/kv-tma-knob.patch && ../.venv/bin/python -m codegen render)
#   (cd .inverted && patch -s -p1 < ../docs/leads/inverted-prefill.patch)
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
ROWS=("prefill tp1 scalar correlated 1x8k prefix0k" "prefill tp4 scalar correlated 1x8k prefix0k"
      "prefill tp1 scalar random 1x8k prefix120k" "prefill tp4 none random 1x8k prefix0k")
bench() {  # tree, name, seconds, columns...
  local tree=$1 name=$2 secs=$3; shift 3
  (cd "$tree" && timeout -k 10 "$secs" python3 benchmarks/bench.py --configs "$@" --filter "${FILTER[@]}" \
     --out "/tmp/bench_$name" > "$OUT/bench_$name.log" 2>&1)
  echo "bench $name rc=$?"; cp "/tmp/bench_$name/bench.json" "$OUT/bench_$name.json" 2>/dev/null
  grep -E "^prefill" "$OUT/bench_$name.log" | head -20
}
FILTER=("${ROWS[@]}")
bench . auto_after 120 tiled auto
bench .before auto_before 120 tiled auto
timeout -k 5 120 python3 -m pytest tests/gpu -q -p no:cacheprovider -W ignore --tb=line -rf \
  -k "one_launch or auto_selection" > "$OUT/gpu_tests_auto.log" 2>&1
echo "gpu tests rc=$?"; tail -2 "$OUT/gpu_tests_auto.log"
FILTER=("random 1x8k prefix0k")
bench .kvtma kv_tma 150 '{"block_t": 1, "kv_tma": 1}' '{"block_t": 1, "kv_tma": 0}' \
  '{"block_t": 1, "block_n": 64, "num_stages": 2, "kv_tma": 1}' '{"block_t": 1, "block_n": 64, "num_stages": 2, "kv_tma": 0}'
(cd .inverted && timeout -k 10 150 python3 benchmarks/inverted_probe.py --layouts tp1 --out "$OUT/inverted" \
   > "$OUT/inverted_probe.log" 2>&1; echo "inverted probe rc=$?"; tail -25 "$OUT/inverted_probe.log")
