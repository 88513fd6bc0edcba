#!/usr/bin/env bash
# The H200 run of the top-k contract change (issue 11): the GPU accuracy suite on the new kernels,
# then prefill without prefix (and a few decode rows) timed and checked, before and after, in one
# call on one GPU. Run from the repo root with two snapshot trees beside the working tree:
#   .snap    the change (git archive of the commit under test)
#   .before  the previous main's kernels and API, with this change's harness (inputs, references,
#            floors, bench.py with its accuracy column), so both sides get the very same inputs.
# Made here (CPU) before the call, and carried (`carry: [".snap", ".before"]`):
#   git archive HEAD | tar -x -C .snap --exclude=tune_studies --exclude=results
#   git archive 7ae2931 | tar -x -C .before --exclude=tune_studies --exclude=results
#   for f in codegen/{workload,cases,reference,accuracy,shapes}.py benchmarks/bench.py; do cp $f .before/$f; done
# Columns: after (new kernels, vLLM's tails), before_own (old kernels, the same inputs: what a vLLM
# user got), before_neg1 (old kernels on -1 tails: the inputs they were tuned and correct on).
#   bash scripts/h200_contract_run.sh TEST_SECONDS BENCH_SECONDS_PER_RUN
set -uo pipefail
TEST_S=${1:-240}; BENCH_S=${2:-150}
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
FILTERS=()
for layout in tp1 tp4; do
  for mode in scalar per_token_head none; do
    for pattern in correlated random; do
      FILTERS+=("prefill $layout $mode $pattern 1x8k prefix0k" "prefill $layout $mode $pattern 4x2k prefix0k")
    done
  done
done
FILTERS+=("decode tp4 scalar b1 q1 ctx8k" "decode tp4 scalar b8 q1 ctx8k" "decode tp4 scalar b128 q1 ctx8k"
          "decode tp1 scalar b128 q1 ctx8k" "decode tp1 per_token_head b128 q1 ctx8k")
(cd .snap && timeout -s INT "$TEST_S" python3 -m pytest tests/gpu -q -n 12 -p no:cacheprovider --timeout 120 \
  --tb=line -rf -W ignore > "$OUT/gpu_tests.log" 2>&1; echo "rc=$?" >> "$OUT/gpu_tests.log")
tail -4 "$OUT/gpu_tests.log"
bench() {  # tree, tail, name
  (cd "$1" && timeout -k 10 "$BENCH_S" python3 benchmarks/bench.py --configs runtime --tail "$2" \
     --filter "${FILTERS[@]}" --out "/tmp/bench_$3" > "$OUT/bench_$3.log" 2>&1)
  cp "/tmp/bench_$3/bench.json" "$OUT/bench_$3.json" 2>/dev/null
}
bench .snap own after
bench .before own before_own
bench .before -1 before_neg1
python3 - "$OUT" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {}
for name in ("before_neg1", "before_own", "after"):
    try:
        runs[name] = {r["case"]: r for r in json.loads((out / f"bench_{name}.json").read_text())["rows"] if "error" not in r}
    except (OSError, ValueError):
        runs[name] = {}
cases = list(runs["after"]) or list(runs["before_own"])
print(f"{'case':52s} {'old,-1 us':>10s} {'old,own us':>10s} {'err':>8s} {'new us':>10s} {'err':>8s} {'new/old-1':>9s} {'%bf16':>6s}")
for c in cases:
    a, b, n = (runs[k].get(c, {}) for k in ("before_neg1", "before_own", "after"))
    t = lambda r: f"{r['time_us']:10.1f}" if r else f"{'-':>10s}"
    e = lambda r: f"{r['rel_l2']:8.1e}" if r else f"{'-':>8s}"
    ratio = f"{n['time_us'] / a['time_us']:9.3f}" if a and n else f"{'-':>9s}"
    frac = f"{100 * n.get('bf16_fraction', 0):6.1f}" if n else ""
    print(f"{c[:52]:52s} {t(a)} {t(b)} {e(b)} {t(n)} {e(n)} {ratio} {frac}")
EOF
