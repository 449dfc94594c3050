#!/usr/bin/env bash
# GPU box, issue 19's second sitting: the decode step's fused kernels. Carry .carry/traces, .carry/lcpp-src.tgz,
# .carry/baselines. Stages (one device call each, in this order, back to back):
#   check  (~5 min) llama.cpp builds in the background; GPU tests of the new kernels and everything they touch;
#          the fused step's profile (kernels per step, GPU busy, the top kernels)
#   bench  (~9 min) ft bench e2e: fused greedy b1/b4; hybrid/offload on the trace; hybrid sampled (varied
#          tokens); llama-bench --n-cpu-moe 0 / 9 at 6 / 16 threads
set -uo pipefail
source bench/gpu/lib.sh
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1  # .carry/pylib: llguidance, accelerate (the box lacks them)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
TRACE=.carry/traces/locality-48x128x8.npy
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25"
for stage in ${*:-check bench}; do case $stage in
check)
  build_llama 10
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_step_kernels.py tests/test_paged_attention.py \
    tests/test_norm.py tests/test_sampler.py tests/test_step_graph_gpu.py tests/test_reference_models.py \
    tests/test_backends.py tests/test_layer_graphs_gpu.py > "$OUT/gpu_tests.log" 2>&1
  tail -1 "$OUT/gpu_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20
  [ -f $CK/model.safetensors.index.json ] || $E2E --policies fused --batch 1 --tokens 8 --repeats 1 --no-moe-only \
    > "$OUT/write.log" 2>&1
  timeout 90 python3 bench/gpu/e2e_profile.py $CK --backend fused --top 25 2>&1 | tail -27
  timeout 60 python3 bench/gpu/e2e_profile.py $CK --backend fused --batch 4 2>&1 | tail -1
  echo "llama.cpp build: $(cat /tmp/lc/built 2>/dev/null || echo running)" ;;
bench)
  timeout 150 $E2E --policies fused --cpu-threads 6 --batch 1,4 --json "$OUT/e2e_fused.json" > "$OUT/e2e_fused.log" \
    2> "$OUT/e2e_fused.err"; tail -4 "$OUT/e2e_fused.log"; grep -iE "error|Traceback" "$OUT/e2e_fused.err" | head -5
  timeout 200 $E2E --policies offload,hybrid --cpu-threads 6,16 --batch 1,4 --repeats 2 --routing-trace $TRACE \
    --json "$OUT/e2e_trace.json" > "$OUT/e2e_trace.log" 2> "$OUT/e2e_trace.err"; tail -10 "$OUT/e2e_trace.log"
  timeout 120 $E2E --policies hybrid --cpu-threads 6,16 --batch 1 --repeats 2 --temperature 1.0 \
    --json "$OUT/e2e_sampled.json" > "$OUT/e2e_sampled.log" 2> "$OUT/e2e_sampled.err"; tail -4 "$OUT/e2e_sampled.log"
  if wait_llama 60; then
    [ -f /tmp/m.gguf ] || PYTHONPATH=/tmp/lc/llama.cpp/gguf-py python3 bench/gpu/make_gguf.py /tmp/m.gguf 12 | tail -1
    peer_decode /tmp/m.gguf 9:6 9:16 0:6 0:16
  else echo "llama.cpp not built: $(tail -3 /tmp/lc/build.log 2>/dev/null)"; fi ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
