#!/usr/bin/env bash
# One H200 call: the default search (leaders transfer, 40 trials) on one table of each kernel
# (TP4, scalar, fp8: 14 prefill studies, 10 decode), from a fresh study database, with the trials'
# and the preparer's time accounts. The default grid is 9 such tables of each kernel, so the run's
# time x 9 estimates a full default re-tune (results/h200/tune-sample).
#   bash scripts/h200_tune_sample.sh        (device `run`, carry [".whl"]; TUNE_S seconds of tuning,
#                                            TUNE_ARGS more msa-tune arguments, e.g. --patience 10)
OUT=${OUT:-/tmp/msa-tune-out}
GRID_ARGS="--layouts tp4 --modes scalar:fp8" DB=/tmp/sample.db OUT_ARGS="--out $OUT/cfg" TUNE_S=${TUNE_S:-430} \
  OUT=$OUT exec bash "$(dirname "$0")/h200_full_retune.sh"
