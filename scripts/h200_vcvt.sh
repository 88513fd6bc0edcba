#!/usr/bin/env bash
# The decode re-tune for kv_upcast 3 and the kv_tma knob, and its before/after on the H200 (issues 12
# and 13), by stage, one device call each (carry [".whl", ".before"]; .before = the previous main:
#   rm -rf .before && mkdir .before && git archive HEAD | tar -x -C .before --exclude=tune_studies --exclude=results):
#   bash scripts/h200_vcvt.sh decode     # ~350 s: 81 decode buckets x their candidates, kv_tma 0 and 1,
#                                        #   kv_upcast 3 for 2 (scripts/h200_decode_candidates_v4.json, 10-18 a table)
#   bash scripts/h200_decode_run.sh 0 75 # ~450 s: the full decode grid, .before and this tree, mode by mode
#   bash scripts/h200_vcvt.sh decode512  # ~100 s: the 512-token decode bucket (128 requests of 4 tokens)
#   bash scripts/h200_vcvt.sh pertoken   # ~400 s: the per-token sub-entries again, kv_tma 0 and 1, kv_upcast 3
#                                        #   for 2 (scripts/h200_pertoken_candidates_v3.json), the 21 missing ones too
# Each stage copies the tuned file and the gzipped study database to $OUT.
set -uo pipefail
STAGE=$1
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
tune() {  # kernel, candidates file, trials, seconds, extra args...
  local kernel=$1 cand=$2 trials=$3 budget=$4; shift 4
  timeout -k 10 $((budget + 60)) python3 tune.py --kernels "$kernel" --candidates "@$cand" --trials "$trials" \
    --precompile-workers 12 --time-budget "$budget" "$@" > "$OUT/tune_${kernel}_$STAGE.log" 2>&1
  echo "tune $kernel rc=$?"; tail -4 "$OUT/tune_${kernel}_$STAGE.log"
  cp tuned_configs/sm90__NVIDIA_H200.json "$OUT/"
  gzip -c tune_studies/sm90__NVIDIA_H200.db > "$OUT/sm90__NVIDIA_H200.db.gz"
}
case $STAGE in
  decode) tune decode scripts/h200_decode_candidates_v4.json 19 330 ;;
  pertoken) tune prefill scripts/h200_pertoken_candidates_v3.json 25 "${PERTOKEN_S:-400}" --prefill-paths per_token ;;
  decode512) tune decode scripts/h200_decode_candidates_v4.json 19 "${DECODE512_S:-150}" --decode-buckets 512 ;;
  *) echo "stage: expected decode, decode512 or pertoken, got $STAGE" >&2; exit 2 ;;
esac
