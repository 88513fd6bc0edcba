#!/usr/bin/env bash
# Re-tune after the prefill-next template change (issue 13) on the H200: each table searches a
# candidate list (every candidate measured on every bucket; --trials covers the longest list):
#   prefill: scripts/h200_prefill_candidates.json, the winners of the probe grid
#            (results/h200/prefill-next) by tokens per program, for 16- and 8-row GQA groups;
#   decode:  scripts/h200_decode_candidates_v2.json, each table's configs on the previous main
#            plus the probe's best at TP4 128 requests.
#   bash scripts/h200_retune.sh prefill|decode SECONDS      (.whl carried: optuna and its deps)
# Since the per-token studies (tune.py --prefill-paths, default both paths), a prefill run also tunes
# each bucket's per-token sub-entry from the candidates' block_t-1 twins: PATHS=per_token tunes those
# alone (the 2026-12-01 run predates them and tuned the tiled entries only).
set -uo pipefail
KERNEL=$1 BUDGET=${2:-400}
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
case $KERNEL in
  prefill) CAND=scripts/h200_prefill_candidates.json TRIALS=13 ;;
  decode) CAND=scripts/h200_decode_candidates_v2.json TRIALS=8 ;;
esac
start=$(date +%s)
timeout -k 10 $((BUDGET + 60)) python3 tune.py --kernels "$KERNEL" --candidates "@$CAND" --trials $TRIALS \
  ${PATHS:+--prefill-paths "$PATHS"} \
  --precompile-workers 12 --time-budget "$BUDGET" > "$OUT/tune_$KERNEL.log" 2>&1
echo "tune $KERNEL rc=$? in $(( $(date +%s) - start )) s"; tail -3 "$OUT/tune_$KERNEL.log"
cp tuned_configs/sm90__NVIDIA_H200.json tune_studies/sm90__NVIDIA_H200.db "$OUT/"
