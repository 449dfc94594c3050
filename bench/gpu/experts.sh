#!/usr/bin/env bash
# GPU box acceptance run for the expert hierarchy (one sitting, < 10 min). Needs the traces carried in
# .carry/traces (copies of ../shared/traces). Writes logs and JSON under $OUT; prints a short table last.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TRACE=.carry/traces/locality-48x128x8.npy
DEC="python3 -m freetoken.bench.decode --preset qwen3-30b-a3b --layers 12 --expert-cache 0.25 --cpu-threads 6,16"
echo "== 1. GPU tests"; timeout 110 python3 -m pytest -q -p no:cacheprovider -m gpu -s tests/test_backends.py \
  tests/test_cpu_kernel.py tests/test_hardware.py tests/test_reference_models.py > "$OUT/gpu_tests.log" 2>&1
tail -3 "$OUT/gpu_tests.log"; grep -E "^bf16|FAILED" "$OUT/gpu_tests.log" | head -30
echo "== 2. CPU expert kernel"; timeout 50 python3 bench/cpu_kernel.py --threads 6,16 --read-gib 4 \
  > "$OUT/cpu_kernel.log" 2>&1; tail -12 "$OUT/cpu_kernel.log"
FREETOKEN_FORCE_AVX2=1 timeout 25 python3 bench/cpu_kernel.py --threads 16 --read-gib 2 --isa avx2 \
  > "$OUT/cpu_kernel_avx2.log" 2>&1; tail -6 "$OUT/cpu_kernel_avx2.log"
echo "== 3. decode, replayed trace"; timeout 290 $DEC --repeats 3 --steps 256 --warmup-tokens 200 \
  --routing-trace $TRACE --measure-bw --json "$OUT/decode_trace.json" > "$OUT/decode_trace.log" 2> "$OUT/decode_trace.err"
echo "== 4. decode, the model's own routing"; timeout 100 $DEC --repeats 1 --steps 128 --warmup-tokens 200 \
  --measure-bw --json "$OUT/decode_model.json" > "$OUT/decode_model.log" 2> "$OUT/decode_model.err"
echo "== summary"; cat "$OUT/decode_trace.log"; echo; cat "$OUT/decode_model.log"; tail -3 "$OUT/decode_trace.err"
