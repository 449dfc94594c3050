#!/usr/bin/env bash
# GPU box: elastic VRAM (issue 23, the elastic half) — one device call, ~4 min.
#   tests     (~1 min) the elastic GPU tests (driver allocations back to the device at once, resizes under the
#             step and layer graphs keep greedy tokens, a budget's shrink frees device memory, half-pinned pool,
#             NVML), the slot cache's GPU tests and the layer graphs' resize test, then the CPU-side elastic
#             tests on the box
#   timeline  (~3 min) bench/elastic_timeline.py: a 6-layer qwen3-30b-a3b-shaped synthetic checkpoint (written
#             once under /tmp), engine budget 40 GiB (reserve 1.5), another process leaves 2 GiB free, then takes
#             8 GiB and later 30 GiB during a 512-token greedy stream; offload (bit-exact by construction) and
#             hybrid; then hybrid with half the pool pinned beside the fully pinned run. CSVs, summary.json and
#             (matplotlib permitting) PNGs under $OUT; prints PASS or FAIL last.
# Run:  bash bench/gpu/elastic_check.sh            (both stages)
#       bash bench/gpu/elastic_check.sh timeline   (one)
# Knobs: LAYERS=6 BUDGET=40 BACKENDS=offload,hybrid TOKENS=512
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1  # .carry/pylib: nvidia-ml-py, llguidance, xxhash (the box lacks them)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
LAYERS=${LAYERS:-6}
CK=/tmp/ft-elastic-qwen3-$LAYERS
python3 -c "import pynvml" 2>/dev/null || echo "note: pynvml (nvidia-ml-py) missing: the VRAM watcher is off and the timeline fails"
for stage in ${*:-tests timeline}; do case $stage in
tests)
  timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_elastic_gpu.py tests/test_slot_cache.py \
    "tests/test_layer_graphs_gpu.py::test_resize_drops_graphs_and_stays_exact" > "$OUT/gpu_tests.log" 2>&1
  tail -1 "$OUT/gpu_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
  timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_elastic_memory.py tests/test_memory_planner.py \
    tests/test_pinned_budget.py > "$OUT/cpu_tests.log" 2>&1
  tail -1 "$OUT/cpu_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/cpu_tests.log" | head -10 ;;
timeline)
  timeout 220 python3 bench/elastic_timeline.py --out "$OUT" --layers "$LAYERS" --dir "$CK" \
    --budget "${BUDGET:-40}" --reserve 1.5 --free-left 2 --tokens "${TOKENS:-512}" --phases 8,30 \
    --backends "${BACKENDS:-offload,hybrid}" --pinned-half > "$OUT/timeline.log" 2> "$OUT/timeline.err"
  echo "timeline rc=$?"; grep -E "same_tokens|first_shrink|other_had_all|back_to_90|oom_log|tok_s|PASS|FAIL" \
    "$OUT/timeline.log" | head -40; grep -E "Traceback|Error" "$OUT/timeline.err" | head -5
  grep -c "memory watcher" "$OUT/timeline.err" | sed 's/^/watcher resizes logged: /' ;;
*) echo "unknown stage $stage (tests, timeline)"; exit 2 ;;
esac; done
