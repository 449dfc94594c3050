#!/usr/bin/env bash
# GPU box: overlapped decode steps (engine/overlap.py; issues 19 and 20). No carry needed (.carry/pylib is used where
# present). ~5 device minutes in all (one call: `bash bench/gpu/overlap_check.sh`); if that call hits its limit, run
# the stages as two calls (`... check`, then `... bench`; the second writes the checkpoint again on a fresh machine):
#   check  the overlap GPU tests (tests/test_step_graph_gpu.py runs overlapped too now: the default on CUDA); the synthetic 12-layer qwen3-30b-a3b checkpoint (written
#          once); e2e_profile.py, fused, batch 1 and 4, overlap on and off (GPU busy share of the steps' wall time)
#   bench  ft bench e2e --policies fused,hybrid, batch 1 and 4, overlap on and off (hybrid runs serially: its CPU
#          branch's host work needs the previous step; its on/off rows should agree)
# The last lines are a short table of both stages' figures.
set -uo pipefail
source bench/gpu/lib.sh
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25"
write_ck() {  # the synthetic checkpoint, once per machine (~15 GB)
  [ -f $CK/model.safetensors.index.json ] || timeout 120 $E2E --policies fused --batch 1 --tokens 8 --repeats 1 \
    --no-moe-only > "$OUT/write.log" 2>&1
}
for stage in ${*:-check bench}; do case $stage in
check)
  timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_overlap_gpu.py > "$OUT/overlap_gpu_tests.log" 2>&1
  echo "GPU tests: $(tail -1 "$OUT/overlap_gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/overlap_gpu_tests.log" | head
  write_ck
  for b in 1 4; do for ov in overlap no-overlap; do
    timeout 40 python3 bench/gpu/e2e_profile.py $CK --backend fused --batch $b --$ov 2>&1 | tail -1 \
      | tee -a "$OUT/profile.txt"
  done; done ;;
bench)
  write_ck
  for ov in overlap no-overlap; do
    timeout 75 $E2E --policies fused,hybrid --batch 1,4 --repeats 1 --tokens 48 --warmup 8 --no-moe-only --$ov --json "$OUT/e2e_$ov.json" \
      > "$OUT/e2e_$ov.log" 2> "$OUT/e2e_$ov.err"
    grep -iE "error|Traceback" -A3 "$OUT/e2e_$ov.err" | head -6
    grep "^|" "$OUT/e2e_$ov.log" | sed "s/^/$ov /" >> "$OUT/e2e_table.txt"
  done ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
echo "== overlap summary =="
[ -f "$OUT/profile.txt" ] && sed -E 's/^(fused batch [0-9]+) graphs True (overlap \w+): ([0-9.]+ ms\/step).*GPU busy ([0-9.]+%).*(launched ahead [0-9]+).*/\1 \2: \3, GPU busy \4, \5/' \
  "$OUT/profile.txt"
[ -f "$OUT/e2e_table.txt" ] && grep -vE "threads \| policy|\|---" "$OUT/e2e_table.txt" | awk -F'|' '{print $1 "|" $3 "|" $4 "|" $5}'
exit 0
