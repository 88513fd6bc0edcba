# Call 1 of results/h100/decode-multitoken-check, run from the root of f2c909b's tree with .whl and .before
# (bd2457d, `git archive`) carried. dev_h100cfg/ held the H200 table with its device renamed, so the H100
# looks up the H200's tuned configs, made on the CPU by:
#   mkdir -p dev_h100cfg && python3 -c "import json; d = json.load(open('tuned_configs/sm90__NVIDIA_H200.json'));
#     d['device'] = 'NVIDIA_H100'; json.dump(d, open('dev_h100cfg/sm90__NVIDIA_H100.json', 'w'), indent=1)"
set -uo pipefail
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100; then export MSA_TUNE_CONFIG_DIR=$PWD/dev_h100cfg; echo "H100: the H200 table via $MSA_TUNE_CONFIG_DIR"; fi
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
start=$(date +%s)
bash scripts/gpu_check.sh --log $OUT/gpu_check.log
echo "gpu_check rc=$? in $(( $(date +%s) - start )) s"
tail -2 $OUT/gpu_check.log
F=""
for tp in tp1 tp4 tp8; do for m in scalar per_token_head; do for b in b8 b32; do F="$F;decode $tp $m $b q4 ctx8k"; done; done; done
start=$(date +%s)
FILTER="${F#;}" BENCH_S=${BENCH_S:-110} bash scripts/h200.sh grid decode
echo "grid in $(( $(date +%s) - start )) s"
python3 benchmarks/probes/before_after.py --before $OUT/bench_before.json --after $OUT/bench_after.json > $OUT/before_after.md 2>&1
head -40 $OUT/before_after.md
