#!/usr/bin/env bash
# GPU box, issue 19's second sitting: the decode step's fused kernels. Carry .carry/traces, .carry/lcpp-src.tgz,
# .carry/baselines. Stages (one device call each, in this order, back to back):
#   check  (~5 min) llama.cpp builds in the background; GPU tests of the new kernels and everything they touch;
#          the fused step's profile (kernels per step, GPU busy, the top kernels)
#   bench  (~9 min) ft bench e2e: fused greedy b1/b4; hybrid/offload on the trace; hybrid sampled (varied
#          tokens); llama-bench --n-cpu-moe 0 / 9 at 6 / 16 threads
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1  # .carry/pylib: llguidance, accelerate (the box lacks them)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
TRACE=.carry/traces/locality-48x128x8.npy
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25"
for stage in ${*:-check bench}; do case $stage in
check)
  if [ ! -x /tmp/lc/llama.cpp/build/bin/llama-bench ]; then
    (setsid bash -c "mkdir -p /tmp/lc && tar xzf .carry/lcpp-src.tgz -C /tmp/lc && cd /tmp/lc/llama.cpp && \
      cmake -B build -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_FA=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release > /tmp/lc/cmake.log 2>&1 && \
      nice cmake --build build --target llama-bench -j 10 > /tmp/lc/build.log 2>&1; echo done > /tmp/lc/built" \
      > /dev/null 2>&1 < /dev/null &)
  fi
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
  for i in $(seq 1 30); do [ -f /tmp/lc/built ] && break; sleep 5; done
  if [ -x /tmp/lc/llama.cpp/build/bin/llama-bench ]; then
    [ -f /tmp/m.gguf ] || PYTHONPATH=/tmp/lc/llama.cpp/gguf-py python3 .carry/baselines/make_gguf_qwen3moe.py /tmp/m.gguf 12 | tail -1
    B=/tmp/lc/llama.cpp/build/bin/llama-bench
    for ncm in 9 0; do for th in 6 16; do
      timeout 40 $B -m /tmp/m.gguf -ngl 99 --n-cpu-moe $ncm -t $th -p 0 -n 64 -r 3 -o csv 2>/dev/null | tail -n 1 |
        awk -v n=$ncm -v t=$th -F, '{gsub(/"/,""); print "llama.cpp decode n_cpu_moe=" n " threads=" t ": " $(NF-1) " tok/s (sd " $NF ")"}'
    done; done
  else echo "llama.cpp not built: $(tail -3 /tmp/lc/build.log 2>/dev/null)"; fi ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
