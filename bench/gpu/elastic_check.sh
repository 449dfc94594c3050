#!/usr/bin/env bash
# GPU box: elastic VRAM (issue 23, the elastic half) — one device call, ~4 min.
#   tests     (~1 min) the elastic GPU tests (driver allocations back to the device at once, resizes under the
#             step and layer graphs keep greedy tokens, a budget's shrink frees device memory, half-pinned pool,
#             NVML), the slot cache's GPU tests and the layer graphs' resize test, then the CPU-side elastic
#             tests on the box
#   timeline  (~1.5 min, cut at 4) bench/elastic_timeline.py: a 6-layer qwen3-30b-a3b-shaped synthetic checkpoint (written
#             once under /tmp), engine budget 40 GiB (reserve 1.5); per backend (offload, hybrid) 3 s of 512-token
#             greedy requests back to back undisturbed, then another process leaves 2 GiB free and, during 14 s
#             of the same requests back to back, takes 8 GiB more at 2 s, gives it back at 5 s, takes 30 GiB at
#             8 s, gives it back at 11 s; then hybrid with half the pool pinned beside the fully pinned run.
#             CSVs, summary.json (runs[].checks: each criterion) and (matplotlib permitting) PNGs under $OUT;
#             prints PASS or FAIL last.
# Run:  bash bench/gpu/elastic_check.sh            (both stages)
#       bash bench/gpu/elastic_check.sh timeline   (one)
# Knobs: LAYERS=6 BUDGET=40 BACKENDS=offload,hybrid TOKENS=512 PLAN=2:8,5:0,8:30,11:0 SECONDS_=14
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
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_elastic_memory.py tests/test_memory_planner.py \
    tests/test_pinned_budget.py tests/test_elastic_refusal.py > "$OUT/cpu_tests.log" 2>&1
  tail -1 "$OUT/cpu_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/cpu_tests.log" | head -10 ;;
timeline)
  timeout 240 python3 bench/elastic_timeline.py --out "$OUT" --layers "$LAYERS" --dir "$CK" \
    --budget "${BUDGET:-40}" --reserve 1.5 --free-left 2 --tokens "${TOKENS:-512}" \
    --plan "${PLAN:-2:8,5:0,8:30,11:0}" --seconds "${SECONDS_:-14}" --base-seconds 3 \
    --backends "${BACKENDS:-offload,hybrid}" --pinned-half > "$OUT/timeline.log" 2> "$OUT/timeline.err"
  echo "timeline rc=$?"; grep -E "^#|requests\"|same_tokens|equal_by|first_divergence|margin_at|first_shrink|other_had_all|back_to_90|oom_log|tok_s|refusals_logged|\": (true|false)|PASS|FAIL" \
    "$OUT/timeline.log" | head -80; grep -E "Traceback|Error" "$OUT/timeline.err" | head -5
  grep -c "memory watcher" "$OUT/timeline.err" | sed 's/^/watcher resizes logged: /' ;;
*) echo "unknown stage $stage (tests, timeline)"; exit 2 ;;
esac; done
