# One call, two plans by GPU. H200: re-tune the three per_token_head decode tables (buckets 1-256) over
# h200_decode.json, whose per_token_head lists now hold their scalar table's candidates too, then the GPU
# check of this tree with that table. Other GPU (H100): the V_EARLY grid (call_a.sh) and the check.
# Run from the repo root, .whl and .vtree carried.
set -uo pipefail
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case $GPU in
  *H200*) ;;
  *) exec bash call_a.sh ;;
esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
start=$(date +%s)
PYTHONPATH=/tmp/site:$PWD timeout -k 10 ${TUNE_WALL_S:-240} python3 tune.py --storage sqlite:////tmp/pth.db \
  --time-budget ${TUNE_S:-170} --kernels decode --modes per_token_head:fp8 --decode-buckets 1,2,4,8,16,32,64,128,256 \
  --candidates @codegen/tuning/candidates/h200_decode.json --trials 31 --precompile-workers 12 > $OUT/tune_pth.log 2>&1
echo "tune rc=$? in $(( $(date +%s) - start )) s"
grep -v "trial #\|^msa-tune: wrote\|confirming\|^\[" $OUT/tune_pth.log | tail -12
gzip -c /tmp/pth.db > $OUT/pth.db.gz; cp tuned_configs/sm90__NVIDIA_H200.json $OUT/
python3 - <<'PYEOF'
import json
d = json.load(open("tuned_configs/sm90__NVIDIA_H200.json"))
for lay in ("8x1", "16x1", "64x4"):
    p, s = (d["tables"][f"decode/{m}/fp8/{lay}"]["buckets"] for m in ("per_token_head", "scalar"))
    print(lay, " ".join(f"{b}:{p[b]['tuned_us']:.1f}/{s[b]['tuned_us']:.1f}" for b in sorted(p, key=int) if b in s))
PYEOF
start=$(date +%s)
timeout -k 10 ${CHECK_S:-330} bash scripts/h200.sh check
echo "check stage rc=$? in $(( $(date +%s) - start )) s"
tail -2 $OUT/gpu_check.log
