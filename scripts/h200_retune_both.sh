bash scripts/h200_retune.sh decode 200
bash scripts/h200_retune.sh prefill 300
