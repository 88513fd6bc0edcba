set -u
OUT=${OUT:-/tmp/o}
CFG='{"block_n":128,"num_warps":8,"num_stages":1,"num_splits":8,"fused_merge":1,"kv_upcast":0,"kv_tma":0}'
# what-if tree: decode's score mask on every slice (gate off)
rm -rf /tmp/vB && mkdir /tmp/vB && tar --exclude=./.before --exclude=./.whl --exclude=./.git -cf - . | tar -xf - -C /tmp/vB
sed -i 's/gate_masks=True, keep_tma_only=True/gate_masks=False, keep_tma_only=True/' /tmp/vB/templates/decode_split.py.jinja
grep -c "gate_masks=False" /tmp/vB/templates/decode_split.py.jinja
(cd /tmp/vB && python3 -m codegen render > $OUT/render.log 2>&1; echo "render rc=$?")
F=('tp8 per_token_head b8 q4 ctx8k' 'tp8 per_token_head b32 q1 ctx8k' 'tp8 scalar b8 q4 ctx8k' 'tp8 scalar b32 q1 ctx8k' 'tp1 per_token_head b32 q4 ctx8k' 'tp1 per_token_head b128 q1 ctx8k')
for tree in . .before /tmp/vB; do
  echo "== $tree"
  (cd $tree && python3 benchmarks/bench.py --grid serving --filter "${F[@]}" --configs runtime "$CFG" "$(echo $CFG | sed 's/"kv_tma":0/"kv_tma":1/')" 2>&1 | grep -v "^#" | grep decode)
done
C1='decode tp8 per_token_head b8 q4 ctx8k='$CFG; C2='decode tp8 per_token_head b32 q1 ctx8k='$CFG
SECS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --section SourceCounters --import-source no"
for tree in . .before; do
  name=$([ "$tree" = . ] && echo after || echo before)
  (cd $tree && timeout -k 10 150 ncu --clock-control none --profile-from-start off $SECS -o "$OUT/$name" -f \
      python3 benchmarks/probes/ncu_cases.py "$C1" "$C2" > "$OUT/ncu_$name.log" 2>&1; echo "ncu $name rc=$?")
  ncu -i "$OUT/$name.ncu-rep" --page details > "$OUT/$name.txt" 2>&1
  ncu -i "$OUT/$name.ncu-rep" --page source --print-source sass --csv > "$OUT/${name}_sass.csv" 2>/dev/null
done
ls -la $OUT
