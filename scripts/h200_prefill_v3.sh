#!/usr/bin/env bash
# H200 calls for issue 13's third prefill pass (the tile walk that masks only partial slices and
# takes one reduction per page, scores scaled in the exp2's FMA, V zeroed and per_token_head
# scales applied inside the fp8 conversions), by stage, one device call each:
#   bash scripts/h200_prefill_v3.sh probe    # ~200 s: benchmarks/probe.py --kernel prefill, this tree against
#                                            #   the previous main (.before, carried) over small config grids,
#                                            #   then the prefill GPU tests
#   bash scripts/h200_prefill_v3.sh retune   # ~500 s: every prefill bucket, tiled and per-token, over
#                                            #   scripts/h200_prefill_candidates_v3.json (.whl carried); it
#                                            #   resumes the study of tune_studies/; PREFILL_BUCKETS=8192,2048
#                                            #   tunes those buckets only; CANDIDATES=scripts/h200_prefill_candidates_v4.json
#                                            #   TRIALS=9 adds plain-load tiles (kv_tma 0; results/h200/tune-sample)
#   bash scripts/h200_prefill_v3.sh grid     # ~550 s: the prefill grid (1x8k, 4x2k, 1x2k rows) after, then
#                                            #   before (.before carried), then the prefill GPU tests
# .before = the previous main:
#   rm -rf .before && mkdir .before && git archive <previous main> | tar -x -C .before --exclude=tune_studies --exclude=results
set -uo pipefail
STAGE=$1
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
gpu_tests() {
  timeout -k 10 "${TESTS_S:-140}" python3 -m pytest -q -x tests/gpu -k "nan_past or test_prefill_gpu or prefill" \
    -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
  echo "tests rc=$?"; tail -3 "$OUT/gpu_tests.log"
}
case $STAGE in
  probe)
    timeout -k 10 "${PROBE_S:-420}" python3 benchmarks/probe.py --kernel prefill --before .before --out "$OUT/prefill" \
      --compile-jobs 14 ${PROBE_FILTER:+--filter $PROBE_FILTER} > "$OUT/prefill.log" 2>&1
    grep -v "^compile " "$OUT/prefill.log" | tail -45
    gpu_tests ;;
  retune)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    start=$(date +%s)
    timeout -k 10 $(( ${TUNE_S:-470} + 60 )) python3 tune.py --kernels prefill \
      --candidates @${CANDIDATES:-scripts/h200_prefill_candidates_v3.json} --trials ${TRIALS:-5} --precompile-workers 12 \
      ${PREFILL_BUCKETS:+--prefill-buckets $PREFILL_BUCKETS} \
      --time-budget "${TUNE_S:-470}" > "$OUT/tune_prefill.log" 2>&1
    echo "tune rc=$? in $(( $(date +%s) - start )) s"; grep "msa-tune:" "$OUT/tune_prefill.log" | tail -4
    cp tuned_configs/sm90__NVIDIA_H200.json "$OUT/"
    gzip -c tune_studies/sm90__NVIDIA_H200.db > "$OUT/sm90__NVIDIA_H200.db.gz" ;;
  grid)
    PREFILL_FILTER="1x8k 4x2k 1x2k" BENCH_S="${BENCH_S:-200}" TESTS_S=0 bash scripts/h200_prefill_grid.sh
    gpu_tests ;;
  *) echo "stage: expected probe, retune or grid, got $STAGE" >&2; exit 2 ;;
esac
