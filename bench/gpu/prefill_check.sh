#!/usr/bin/env bash
# GPU box: issue 20's check — agent-sized prompts. Two device calls, ~5 minutes of device time in all:
#   check (~3.5 min typical, timeouts total 7 min) llama.cpp's build starts in the background (it outlives the call on a warm machine); the GPU tests
#         of the varlen prefill kernel and the streamer (tests/test_prefill_attention.py, test_prefill_stream.py -m gpu:
#         attention vs the float64 softmax, bf16 rel L2 <= 8e-3 and worst <= 2^-6 max|ref|); then ft bench e2e --prefill
#         on the 12-layer Qwen3-30B-A3B shape, cache 0.25, 16 CPU threads: TTFT cold and warm at 2k/8k/32k/64k,
#         GB copied per prompt, the PCIe bound (pool / B_P,layer), hybrid and fused (all resident: no copies), and
#         3 running streams' ITL p50/p99 while a 32k prompt prefills (hybrid).
#   peer  (~1.5 min) llama.cpp's prompt rate at 8k and 32k (llama-bench -p, all experts on the CPU, 16 threads: the
#         peer of docs/benchmarks.md) once its build is done.
# Prepare .carry/ on the dev box (git-ignored) as bench/gpu/e2e.sh says: .carry/lcpp-src.tgz and .carry/baselines/.
# Run:  run(command="bash bench/gpu/prefill_check.sh check", carry=[".carry"]) then the same with "peer".
# The synthetic checkpoint is written once (~23 s) to $CK and reused.
set -uo pipefail
source bench/gpu/lib.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25 --cpu-threads 16"
for stage in ${*:-check peer}; do case $stage in
check)
  build_llama 8
  echo "== GPU tests: prefill attention, streamer"
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_prefill_attention.py tests/test_prefill_stream.py \
    > "$OUT/prefill_tests.log" 2>&1; tail -1 "$OUT/prefill_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/prefill_tests.log" | head
  echo "== layer-major exactness on the box's CPU"
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_layer_major_prefill.py 2>&1 | tail -1
  echo "== ft bench e2e --prefill (TTFT, bytes, PCIe bound; ITL beside a 32k prefill)"
  timeout 200 $E2E --policies hybrid --no-decode --repeats 1 --prefill 2048,8192,32768,65536 --itl-prompt 32768 \
    --json "$OUT/ttft_hybrid.json" > "$OUT/ttft_hybrid.log" 2> "$OUT/ttft_hybrid.err"
  cat "$OUT/ttft_hybrid.log" | grep "^|"; grep -iE "error|Traceback" -A3 "$OUT/ttft_hybrid.err" | head -8
  timeout 70 $E2E --policies fused --no-decode --repeats 1 --prefill 8192,32768 \
    --json "$OUT/ttft_fused.json" > "$OUT/ttft_fused.log" 2> "$OUT/ttft_fused.err"
  cat "$OUT/ttft_fused.log" | grep "^|" | tail -2; grep -iE "error|Traceback" -A3 "$OUT/ttft_fused.err" | head -8
  echo "llama.cpp build: $(cat /tmp/lc/built 2>/dev/null || echo running)" ;;
peer)
  for i in $(seq 1 36); do [ -f /tmp/lc/built ] && break; sleep 5; done
  if [ -x /tmp/lc/llama.cpp/build/bin/llama-bench ]; then
    [ -f /tmp/m.gguf ] || PYTHONPATH=/tmp/lc/llama.cpp/gguf-py python3 bench/gpu/make_gguf.py /tmp/m.gguf 12 | tail -1
    for p in 8192 32768; do
      timeout 70 /tmp/lc/llama.cpp/build/bin/llama-bench -m /tmp/m.gguf -ngl 99 --n-cpu-moe 12 -t 16 -p $p -n 0 -r 1 \
        -o csv 2>/dev/null | tail -n 1 | awk -v p=$p -F, '{gsub(/"/,""); print "llama.cpp prompt " p ": " $(NF-1) " tok/s"}'
    done
  else echo "llama.cpp not built: $(tail -3 /tmp/lc/build.log 2>/dev/null)"; fi ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
