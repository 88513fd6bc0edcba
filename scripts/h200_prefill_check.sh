#!/usr/bin/env bash
# Follow-up H200 call (issue 13): the random 8k prefill rows with the per-token twin rule, five
# decode headline rows and the 32k prefill rows, before (.before, carried) and after.
set -uo pipefail
OUT=${OUT:-/tmp/msa-tune-out}; export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
timeout -k 5 110 python3 benchmarks/bench.py --configs runtime --filter "random 1x8k" --out /tmp/b_after_random > $OUT/bench_after_random.log 2>&1
echo rc=$?; cp /tmp/b_after_random/bench.json $OUT/bench_after_random.json
for t in after before; do d=.; [ $t = before ] && d=.before
 (cd $d && timeout -k 5 60 python3 benchmarks/bench.py --configs runtime --filter "decode tp4 scalar b1 q1 ctx8k" "decode tp4 scalar b128 q1 ctx8k" "decode tp1 scalar b128 q1 ctx8k" "decode tp1 per_token_head b128 q1 ctx8k" "decode tp8 scalar b256 q1 ctx128k" --out /tmp/b_dec_$t > $OUT/bench_decode_$t.log 2>&1)
 echo rc=$?; cp /tmp/b_dec_$t/bench.json $OUT/bench_decode_$t.json; done
for t in after before; do d=.; [ $t = before ] && d=.before
 (cd $d && timeout -k 5 75 python3 benchmarks/bench.py --configs runtime --filter "1x32k" --out /tmp/b_32k_$t > $OUT/bench_32k_$t.log 2>&1)
 echo rc=$?; cp /tmp/b_32k_$t/bench.json $OUT/bench_32k_$t.json; done
