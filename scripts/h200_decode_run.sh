#!/usr/bin/env bash
# The H200 run of the decode redesign (issue 12): the decode grid (tp1 / tp4 / tp8, 8k and 128k
# contexts, query length 1 and 4, 1..256 requests, three modes) timed before and after in one call,
# each mode's after and before runs back to back. Run from the repo root with `.before`, the
# previous main (ac99c42: kernels, API and its tuned table), beside the working tree:
#   git archive ac99c42 | tar -x -C .before --exclude=tune_studies --exclude=results
# and carried (`carry: [".before", ".whl"]`). Optionally first finishes the decode re-tune.
#   bash scripts/h200_decode_run.sh TUNE_SECONDS BENCH_SECONDS_PER_RUN
set -uo pipefail
TUNE_S=${1:-0}; BENCH_S=${2:-80}
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$TUNE_S" -gt 0 ]; then
  timeout -k 20 $((TUNE_S + 60)) python3 tune.py --kernels decode --trials 16 --precompile-workers 12 \
    --time-budget "$TUNE_S" > "$OUT/tune_finish.log" 2>&1
  tail -3 "$OUT/tune_finish.log"
  cp tuned_configs/sm90__NVIDIA_H200.json tune_studies/sm90__NVIDIA_H200.db "$OUT/"
fi
bench() {  # tree, mode, name
  (cd "$1" && timeout -k 10 "$BENCH_S" python3 benchmarks/bench.py --configs runtime \
     --filter "decode tp1 $2 " "decode tp4 $2 " "decode tp8 $2 " --out "/tmp/bench_$3" > "$OUT/bench_$3.log" 2>&1)
  cp "/tmp/bench_$3/bench.json" "$OUT/bench_$3.json" 2>/dev/null
}
for mode in scalar per_token_head none; do
  bench . "$mode" "after_$mode"
  bench .before "$mode" "before_$mode"
done
cd "$OUT" && tar -czf bench.tgz bench_*.json bench_*.log && rm -f bench_*.json bench_*.log
