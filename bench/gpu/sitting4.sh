#!/usr/bin/env bash
# GPU box, twelfth session's first sitting (carry .carry: lcpp-src.tgz, pylib, traces, wheels, old-src.tgz,
# baselines). Stages, one device call each, back to back:
#   a1 (~8 min) llama.cpp builds in the background; the merged tree's GPU tests (incl. the Qwen3-Next fp32 logit
#      tests after the conv left cuDNN, the graphed grammar-constrained step); the elastic check (tests + timeline)
#   a2 (~8 min) issue 20's prefill_check2 (TTFT cold/warm, ITL A/B, HTTP TTFT) and llama.cpp's prompt rate; the fp8
#      CPU kernel at 6 and 16 threads (direct call and queued as decode drives it); llama.cpp Q8_0 decode rows
#   a3 (~5 min) FTW load figures (the other checkpoints deleted first: 64 GiB disk)
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source bench/gpu/lib.sh
for stage in "$@"; do case $stage in
a1)
  build_llama 10
  timeout 260 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_prefill_attention.py tests/test_prefill_stream.py \
    tests/test_reference_models.py tests/test_reference_hybrid.py tests/test_state_checkpoints.py tests/test_step_graph_gpu.py \
    tests/test_step_kernels.py tests/test_paged_attention.py tests/test_sampler.py tests/test_backends.py \
    > "$OUT/gpu_tests.log" 2>&1
  echo "GPU tests: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10
  OUT=$OUT/elastic bash bench/gpu/elastic_check.sh tests timeline 2>&1 | tail -60 ;;
a2)
  OUT=$OUT/prefill bash bench/gpu/prefill_check2.sh check peer 2>&1 | tail -40
  timeout 100 python3 bench/cpu_fp8.py --threads 16 --iters 5 --pool-gib 2 --read-gib 4 > "$OUT/cpu_fp8_16.md" \
    2> "$OUT/cpu_fp8.err" || echo "cpu_fp8 16 failed: $(tail -2 "$OUT/cpu_fp8.err")"
  timeout 80 python3 bench/cpu_fp8.py --threads 6 --iters 5 --pool-gib 2 --read-gib 4 > "$OUT/cpu_fp8_6.md" \
    2>> "$OUT/cpu_fp8.err" || echo "cpu_fp8 6 failed: $(tail -2 "$OUT/cpu_fp8.err")"
  grep "^|" "$OUT/cpu_fp8_16.md" | head -2; grep -h "^| [0-9]" "$OUT/cpu_fp8_16.md" "$OUT/cpu_fp8_6.md"
  rm -f /tmp/m.gguf
  if wait_llama 6; then
    PYTHONPATH=/tmp/lc/llama.cpp/gguf-py timeout 120 python3 bench/gpu/make_gguf.py /tmp/q8.gguf 12 q8_0 | tail -1
    peer_decode /tmp/q8.gguf 9:16 9:6; rm -f /tmp/q8.gguf
  else echo "llama.cpp not built: $(tail -3 /tmp/lc/build.log 2>/dev/null)"; fi ;;
a3)
  rm -rf /tmp/m.gguf /tmp/q8.gguf /tmp/ft-e2e-qwen3-12 /tmp/ft-elastic-qwen3-*; df -h /tmp | tail -1
  OUT=$OUT/ftw bash bench/gpu/ftw_check.sh tests load 2>&1 | tail -30 ;;
*) echo "unknown stage $stage (a1, a2, a3)"; exit 2 ;;
esac; done
