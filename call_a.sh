# Call 1 of results/<gpu>/decode-v-early: the small-batch decode rows of the v-early branch (.vtree, `git archive
# v-early`) against this tree (main), then the GPU check of this tree. Run from the repo root, .whl and .vtree carried.
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
F=""
for tp in tp1 tp4 tp8; do for m in scalar per_token_head; do for b in "b1 q1" "b8 q1"; do F="$F;decode $tp $m $b ctx8k"; done; done; done
F="$F;decode tp4 none b1 q1 ctx8k;decode tp4 scalar b1 q4 ctx8k;decode tp1 scalar b1 q4 ctx8k"
start=$(date +%s)
FILTER="${F#;}" AFTER_TREE=.vtree BEFORE_TREE=. BENCH_S=${BENCH_S:-120} bash scripts/h200.sh grid decode
echo "grid in $(( $(date +%s) - start )) s"
python3 benchmarks/probes/before_after.py --before $OUT/bench_before.json --after $OUT/bench_after.json > $OUT/before_after.md 2>&1
head -30 $OUT/before_after.md
[ -n "${SKIP_CHECK:-}" ] && exit 0
start=$(date +%s)
timeout -k 10 ${CHECK_S:-330} bash scripts/h200.sh check
echo "check stage rc=$? in $(( $(date +%s) - start )) s"
tail -2 $OUT/gpu_check.log
