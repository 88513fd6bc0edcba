#!/bin/bash
# One H200 call (issue 13, 2026-12-01): three prefill leads against main, side by side
# (results/h200/prefill-leads). Needs the trees under .leads/ (ignored; carry it):
#   git archive <main> -- codegen templates benchmarks tuned_configs | tar -x -C .leads/before
#   for each of prefill-rotated (76414b5), prefill-partial-hoist (90fb621): a worktree of <main>,
#     `git show <commit> -- templates | git apply -3`, `python -m codegen render`, then its
#     codegen templates benchmarks tuned_configs copied to .leads/rot and .leads/hoist
#     (.leads/hoist/benchmarks/probe.py: two more PREFILL_SPECS, tp8 none and scalar random 1x8k)
#   git archive inverted-v2 -- codegen templates benchmarks tuned_configs prototypes | tar -x -C .leads/inv
# Run: bash scripts/h200_prefill_leads.sh   (device `run`, carry [".leads"])
set -u
L=$(pwd)/.leads
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch,triton;print('torch',torch.__version__,'triton',triton.__version__)"
export PYTHONUNBUFFERED=1
(cd $L/rot && timeout ${ROT_S:-230} python3 benchmarks/probe.py --kernel prefill --before $L/before --out $OUT/rot \
   --compile-jobs 14 --filter "scalar correlated 1x8k" "none correlated" "scalar correlated 4x2k" "scalar random 4x2k" "scalar random 1x8k prefix0k" 2>&1 | tee $OUT/rot.log | grep -v "^compile ")
(cd $L/hoist && timeout ${HOIST_S:-120} python3 benchmarks/probe.py --kernel prefill --before $L/before --out $OUT/hoist \
   --compile-jobs 14 --filter "tp8" "scalar random 4x2k" 2>&1 | tee $OUT/hoist.log | grep -v "^compile ")
(cd $L/inv && timeout ${INV_S:-190} python3 benchmarks/inverted_probe.py --out $OUT/inv --layouts tp1,tp4 \
   --filter "scalar random 1x8k" 2>&1 | tee $OUT/inv.log | tail -60)
