#!/usr/bin/env bash
# GPU box: the fast decode step (issue 19) — GPU tests, ft bench e2e beside the MoE layers alone, the
# GPU-busy profile of a fused step, and the llama.cpp peer on the same shape in the same sitting.
#
# Prepare .carry/ on the dev box (git-ignored): .carry/traces/locality-48x128x8.npy,
# .carry/lcpp-src.tgz and .carry/baselines/ (see ../shared/baselines/README.md); carry all three.
# Stages (each one device call):
#   check  (~6 min) llama.cpp's build starts in the background (it outlives the call); GPU tests of
#          attention, sampling, the step graph, layer graphs, backends, reference models; e2e smoke
#   bench  (~9 min) ft bench e2e: fused, offload, hybrid, static-layers at 6 and 16 threads, batch 1 and 4,
#          model routing, then hybrid and offload on the trace; GPU busy of a fused step; llama-bench
set -uo pipefail
source bench/gpu/lib.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
TRACE=.carry/traces/locality-48x128x8.npy
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25"
for stage in ${*:-check bench}; do case $stage in
check)
  build_llama 12
  timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_paged_attention.py tests/test_prefill_attention.py tests/test_norm.py tests/test_sampler.py \
    tests/test_step_graph_gpu.py tests/test_layer_graphs_gpu.py tests/test_backends.py tests/test_reference_models.py \
    tests/test_slot_cache.py tests/test_cpu_stream_gpu.py > "$OUT/gpu_tests.log" 2>&1
  tail -1 "$OUT/gpu_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
  timeout 200 $E2E --policies fused,hybrid --cpu-threads 16 --batch 1 --tokens 32 --repeats 1 --moe-steps 32 \
    > "$OUT/e2e_smoke.log" 2> "$OUT/e2e_smoke.err"; tail -4 "$OUT/e2e_smoke.log"; tail -3 "$OUT/e2e_smoke.err"
  echo "llama.cpp build: $(cat /tmp/lc/built 2>/dev/null || echo running)" ;;
bench)
  timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_reference_models.py tests/test_paged_attention.py 2>&1 | tail -2
  timeout 300 $E2E --policies fused,offload,hybrid,static-layers --cpu-threads 6,16 --batch 1,4 --json "$OUT/e2e.json" \
    > "$OUT/e2e.log" 2> "$OUT/e2e.err"; cat "$OUT/e2e.log" | tail -18; grep -iE "error|Traceback" "$OUT/e2e.err" | head -5
  timeout 45 python3 bench/gpu/e2e_profile.py $CK --backend fused 2>&1 | tail -1
  if wait_llama 60; then
    PYTHONPATH=/tmp/lc/llama.cpp/gguf-py python3 bench/gpu/make_gguf.py /tmp/m.gguf 12 | tail -1
    peer_decode /tmp/m.gguf 9:6 9:16 0:6 0:16
  else echo "llama.cpp not built: $(tail -3 /tmp/lc/build.log 2>/dev/null)"; fi ;;
trace)
  timeout 300 $E2E --policies offload,hybrid --cpu-threads 6,16 --batch 1,4 --repeats 2 --routing-trace $TRACE \
    --json "$OUT/e2e_trace.json" > "$OUT/e2e_trace.log" 2> "$OUT/e2e_trace.err"; tail -10 "$OUT/e2e_trace.log"
  timeout 45 python3 bench/gpu/e2e_profile.py $CK --backend fused --no-cuda-graphs 2>&1 | tail -1 ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
