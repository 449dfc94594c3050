#!/usr/bin/env bash
# GPU box, this session's sitting (carry .carry/lcpp-src.tgz, .carry/pylib, .carry/traces). Stages, one call each:
#   fp8    (~9 min) issue 22: llama.cpp builds in the background; the fp8 GPU tests; the fp8 CPU kernel at 6 and 16
#          threads beside the streaming read; ft bench e2e --preset qwen3-30b-a3b-fp8 (hybrid, offload, static-layers,
#          6 and 16 threads, sampled model routing) beside llama-bench on a Q8_0 GGUF of the same shape
#   step   (~9 min) issues 19-21: GPU tests of the merged tree; e2e on the v2 checkpoint (near-uniform own routing)
#          fused + hybrid, llama-bench bf16 --n-cpu-moe 9 / 0; issue 20's TTFT at 2k/8k/32k cold/warm + ITL
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/gpu/lib.sh
for stage in ${*:-fp8 step}; do case $stage in
fp8)
  build_llama 12
  timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_experts.py tests/test_fp8_checkpoint.py \
    > "$OUT/fp8_gpu_tests.log" 2>&1; echo "fp8 GPU tests: $(tail -1 "$OUT/fp8_gpu_tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/fp8_gpu_tests.log" | head -5
  timeout 150 python3 bench/cpu_fp8.py --threads 6,16 --iters 7 --pool-gib 2 --read-gib 4 > "$OUT/cpu_fp8.md" \
    2> "$OUT/cpu_fp8.err" || echo "cpu_fp8 failed: $(tail -2 "$OUT/cpu_fp8.err")"
  grep "^|" "$OUT/cpu_fp8.md"
  timeout 200 $E2E --preset qwen3-30b-a3b-fp8 --policies hybrid,offload,static-layers --cpu-threads 6,16 --batch 1 \
    --repeats 2 --temperature 1.0 --json "$OUT/e2e_fp8.json" > "$OUT/e2e_fp8.log" 2> "$OUT/e2e_fp8.err"
  grep "^|" "$OUT/e2e_fp8.log"; grep -iE "error|Traceback" -A3 "$OUT/e2e_fp8.err" | head -6
  rm -rf /tmp/ftc/bench/*fp8*
  if wait_llama 12; then
    PYTHONPATH=/tmp/lc/llama.cpp/gguf-py timeout 120 python3 bench/gpu/make_gguf.py /tmp/q8.gguf 12 q8_0 | tail -1
    peer_decode /tmp/q8.gguf 9:6 9:16 0:6; rm -f /tmp/q8.gguf
  else echo "llama.cpp not built: $(tail -3 /tmp/lc/build.log 2>/dev/null)"; fi ;;
step)
  build_llama 12
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_prefill_attention.py tests/test_prefill_stream.py \
    tests/test_reference_models.py tests/test_reference_hybrid.py tests/test_state_checkpoints.py tests/test_step_graph_gpu.py \
    tests/test_ftw.py tests/test_step_kernels.py > "$OUT/gpu_tests.log" 2>&1
  echo "GPU tests: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10
  timeout 150 $E2E --preset qwen3-30b-a3b --policies fused,hybrid --cpu-threads 6,16 --batch 1 --repeats 2 \
    --temperature 1.0 --json "$OUT/e2e_v2.json" > "$OUT/e2e_v2.log" 2> "$OUT/e2e_v2.err"
  grep "^|" "$OUT/e2e_v2.log"; grep -iE "error|Traceback" -A3 "$OUT/e2e_v2.err" | head -6
  if wait_llama 6; then
    PYTHONPATH=/tmp/lc/llama.cpp/gguf-py timeout 60 python3 bench/gpu/make_gguf.py /tmp/m.gguf 12 bf16 | tail -1
    peer_decode /tmp/m.gguf 9:6 9:16 0:6
  fi
  timeout 170 $E2E --preset qwen3-30b-a3b --policies hybrid --cpu-threads 16 --no-decode --repeats 1 \
    --prefill 2048,8192,32768 --itl-prompt 32768 --json "$OUT/ttft.json" > "$OUT/ttft.log" 2> "$OUT/ttft.err"
  grep "^|" "$OUT/ttft.log"; grep -iE "error|Traceback" -A3 "$OUT/ttft.err" | head -6 ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
