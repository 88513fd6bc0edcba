#!/usr/bin/env bash
# Experiment (H200, 2026-11-29): upcast fp8 K/V to bf16 through fp32 instead of directly, by
# rewriting a throw-away copy of the generated sm90 modules, and time both trees with the same
# (tuned) configs. Run from the repo root on the GPU machine. Findings: docs/perf-notes.md.
set -euo pipefail
export PYTHONUNBUFFERED=1
R=$PWD
rm -rf /tmp/alt && cp -r "$R" /tmp/alt
sed -i 's/k.to(q.dtype))/k.to(tl.float32).to(q.dtype))/; s/v.to(q.dtype))/v.to(tl.float32).to(q.dtype))/' \
  /tmp/alt/codegen/generated/sm90_*.py
for tree in "$R" /tmp/alt; do
  echo "=== $tree"
  (cd "$tree" && PYTHONPATH=$tree python3 benchmarks/bench.py --quick --configs runtime \
     --filter "b128 q1 ctx8k" "correlated 1x8k" "b1 q1")
done
