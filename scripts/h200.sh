#!/usr/bin/env bash
# H200 device experiments, one named stage per device call (the one-off runners of 2026-11-29..12-01
# are in git history; what they found is indexed in results/README.md). Run from the repo root:
#   bash scripts/h200.sh sample                 # ~8 min: the default search on one table of each kernel
#                                               #   (TP4 scalar fp8) from a fresh study; x9 estimates a full
#                                               #   re-tune (results/h200/tune-sample)
#   bash scripts/h200.sh retune                 # the full default re-tune for TUNE_S s, resumable (below)
#   bash scripts/h200.sh candidates LIST        # re-tune over codegen/tuning/candidates/h200_LIST.json
#                                               #   (decode, prefill_tiles, prefill_per_token, prefill_incumbents,
#                                               #   prefill_incumbents_per_token, prefill_ws, prefill_ws_per_token);
#                                               #   TRIALS (default: every candidate), TUNE_S, TUNE_ARGS (e.g.
#                                               #   "--modes per_token_head:fp8"; decode: its 512 bucket, and 256
#                                               #   on a GPU under 100 GB, in a second run with 3 preparers)
#   bash scripts/h200.sh grid decode|prefill    # the bench grid of this tree, then of .before (FILTER:
#                                               #   label substrings separated by ';'; AFTER_TREE and
#                                               #   BEFORE_TREE name other trees, e.g. an experiment's)
#   bash scripts/h200.sh probe                  # benchmarks/probes/probe.py: .before's prefill against this tree's
#   bash scripts/h200.sh profile                # Nsight Compute counters of NCU_CASES (benchmarks/probes/ncu_cases.py)
#   bash scripts/h200.sh tests                  # the GPU test suite
#   bash scripts/h200.sh check                  # scripts/gpu_check.sh, its log to $OUT
# On an H100 (when no H200 is lent) the loader itself looks up the H200's table (codegen/tuned_store.py,
# BORROWED_TABLES), in this tree and in trees since 2026-12-07; results name the GPU.
# Carry what a stage needs: ".whl" (optuna and its deps, for the tuning stages), ".before" (the previous
# main, for grid and probe: mkdir .before && git archive MAIN | tar -x -C .before --exclude=results), and
# for a resumed re-tune "tune_studies" (ignored by git). Study state between calls: each tuning stage
# writes its database gzipped to $OUT; put it back as tune_studies/NAME.db.gz and carry tune_studies: the
# stage unzips it before tuning (docs/tuning.md, "Study state").
set -uo pipefail
STAGE=${1:-}
OUT=${OUT:-/tmp/msa-tune-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader

optuna_wheels() {  # the device image has no optuna: install the carried wheels
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
}

tune() {  # DB, log name, tune.py arguments...: restore DB from its .gz, tune TUNE_S s, hand DB and table back
  local db=$1 log=$2; shift 2
  [ ! -f "$db" ] && [ -f "$db.gz" ] && gunzip -k "$db.gz"
  local start budget=${TUNE_S:-480}
  start=$(date +%s)
  timeout -k 10 $((budget + 90)) python3 tune.py --storage "sqlite:///$db" --time-budget "$budget" "$@" \
    > "$OUT/$log.log" 2>&1
  echo "tune rc=$? in $(( $(date +%s) - start )) s"
  grep -v "trial #\|^msa-tune: wrote\|confirming\|^\[" "$OUT/$log.log" | tail -8
  gzip -c "$db" > "$OUT/$(basename "$db").gz"
}

bench() {  # tree, name, filters...: the runtime's configs on the bench grid
  local tree=$1 name=$2; shift 2
  (cd "$tree" && timeout -k 10 "${BENCH_S:-200}" python3 benchmarks/bench.py --configs runtime --filter "$@" \
     --out "/tmp/bench_$name" > "$OUT/bench_$name.log" 2>&1)
  echo "bench $name rc=$?"; cp "/tmp/bench_$name/bench.json" "$OUT/bench_$name.json" 2>/dev/null
}

case $STAGE in
  sample)
    optuna_wheels
    tune /tmp/sample.db tune --layouts tp4 --modes scalar:fp8 --out "$OUT/cfg" ${TUNE_ARGS:-} ;;
  retune)
    optuna_wheels
    tune "$PWD/tune_studies/sm90__NVIDIA_H200.full.db" tune ${TUNE_ARGS:-}
    cp tuned_configs/*.json "$OUT/" ;;  # the H200's; on an H100 its own (sm90__NVIDIA_H100.json) too
  candidates)
    LIST=${2:?candidates: name a list: decode, prefill_tiles or prefill_per_token}
    case $LIST in
      decode) ARGS=(--kernels decode) ;;
      prefill_tiles) ARGS=(--kernels prefill) ;;
      prefill_per_token|prefill_incumbents_per_token) ARGS=(--kernels prefill --prefill-paths per_token) ;;
      prefill_incumbents) ARGS=(--kernels prefill --prefill-paths tiled) ;;
      prefill_ws) ARGS=(--kernels prefill --prefill-paths tiled --modes scalar:fp8,per_token_head:fp8) ;;
      prefill_ws_per_token) ARGS=(--kernels prefill --prefill-paths per_token --modes scalar:fp8,per_token_head:fp8) ;;
      *) echo "candidates: expected decode, prefill_tiles, prefill_per_token, prefill_incumbents," \
              "prefill_incumbents_per_token, prefill_ws or prefill_ws_per_token, got $LIST" >&2; exit 2 ;;
    esac
    optuna_wheels
    # Without TRIALS the tuner measures every candidate of each list (plus the default).
    CAND=(--candidates "@codegen/tuning/candidates/h200_$LIST.json" ${TRIALS:+--trials "$TRIALS"})
    PREPARERS=12
    if [ "$LIST" = decode ]; then
      # The largest buckets with 3 preparers: with 12, each preparer kept ~14 GiB of GPU memory and every
      # trial of decode 64x4@512 ran out of it on the H200 (results/h200/decode-lean, 2026-12-03), as did
      # 64x4@256 on an H100 (80 GiB; results/h100/decode-retune-partial); with 3, none did. The cause is
      # fixed since (docs/tuning.md, "GPU memory"), not yet confirmed on a GPU: keep the split until then.
      LARGE=512
      [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ] && LARGE=256,512
      SMALLER=$(python3 -c "from codegen.shapes import DECODE_BUCKETS as B; print(','.join(str(b) for b in B if str(b) not in '$LARGE'.split(',')))")
      tune "$PWD/tune_studies/sm90__NVIDIA_H200.db" "tune_$LIST" "${ARGS[@]}" "${CAND[@]}" \
        --precompile-workers "$PREPARERS" --decode-buckets "$SMALLER" ${TUNE_ARGS:-}
      ARGS+=(--decode-buckets "$LARGE") && LIST=decode_large && PREPARERS=3
    fi
    tune "$PWD/tune_studies/sm90__NVIDIA_H200.db" "tune_$LIST" "${ARGS[@]}" "${CAND[@]}" \
      --precompile-workers "$PREPARERS" ${TUNE_ARGS:-}
    cp tuned_configs/*.json "$OUT/" ;;  # the H200's; on an H100 its own (sm90__NVIDIA_H100.json) too
  grid)
    KERNEL=${2:?grid: decode or prefill}
    IFS=';' read -ra FILTERS <<< "${FILTER:-$KERNEL}"  # ';' between filters: a label filter has spaces
    bench "${AFTER_TREE:-.}" after "${FILTERS[@]}"
    bench "${BEFORE_TREE:-.before}" before "${FILTERS[@]}" ;;
  probe)
    timeout -k 10 "${PROBE_S:-420}" python3 benchmarks/probes/probe.py --kernel prefill --before .before \
      --out "$OUT/probe" --compile-jobs 14 > "$OUT/probe.log" 2>&1
    echo "probe rc=$?"; grep -v "^compile " "$OUT/probe.log" | tail -45 ;;
  profile)
    mapfile -t CASES <<< "${NCU_CASES:-decode tp1 scalar b128 q1 ctx8k}"
    timeout -k 10 300 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \
      --section SchedulerStats --section ComputeWorkloadAnalysis --section SourceCounters -o "$OUT/profile" -f \
      python3 benchmarks/probes/ncu_cases.py "${CASES[@]}" > "$OUT/ncu.log" 2>&1
    echo "ncu rc=$?"; grep '^\[' "$OUT/ncu.log"
    ncu -i "$OUT/profile.ncu-rep" --page details > "$OUT/profile.txt" 2>&1 ;;
  tests)
    timeout -k 5 "${TESTS_S:-300}" python3 -m pytest tests/gpu -q -n 12 -p no:cacheprovider --timeout 120 -W ignore \
      --tb=line -rf > "$OUT/gpu_tests.log" 2>&1
    echo "tests rc=$?"; tail -4 "$OUT/gpu_tests.log" ;;
  check)
    bash scripts/gpu_check.sh --log "$OUT/gpu_check.log"
    echo "gpu_check rc=$?" ;;
  *) echo "stage: expected sample, retune, candidates, grid, probe, profile, tests or check; got '$STAGE'" >&2; exit 2 ;;
esac
