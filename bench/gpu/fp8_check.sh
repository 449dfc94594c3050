#!/usr/bin/env bash
# GPU box check of issue 22 (fp8 experts with 128x128 block scales), one device call, ~7 min.
#
# Prepare .carry/ once, on the dev machine, from the repository root (.carry/ is git-ignored): the box has no
# accelerate, which transformers' FP8 loading (the tests' oracle) needs:
#   mkdir -p .carry/wheels && pip download accelerate==1.15.0 --no-deps -d .carry/wheels
# and name it in the run's carry: [".carry/wheels"]  (about 0.4 MB).
#
# Stages (default: all three):
#   tests  (~2.5 min) every gpu-marked fp8 test (tests/test_fp8_experts.py: each backend on fp8 banks, the Triton
#          fp8 GEMM at decode and prefill sizes; tests/test_fp8_checkpoint.py: greedy tokens of fused, offload, cpu
#          and hybrid on CUDA equal transformers' dequantised model: the box's transformers must load
#          FineGrainedFP8Config(dequantize=True)), then the fp8 CPU kernel tests on this CPU (its AVX-512 paths on an
#          Intel core)
#   cpu    (~3 min) bench/cpu_fp8.py at 6 and 16 threads: fp8 kernel GB/s of packed bytes beside the streaming
#          read of the same run (% of it; target >= 85% at 16 threads), torch dequantise-then-F.linear, bf16 kernel
#   gemm   (~1 min) bench/gpu/fp8_gemm.py: the Triton fp8 grouped GEMM against its torch reference and the bf16
#          kernel, T = 1, 4, 64, 2048
#   decode (optional, ~2.5 min, not in the default) ft bench decode on qwen3-30b-a3b-fp8 and qwen3-30b-a3b side by
#          side: fused, offload, hybrid at 6 and 16 threads, 12 layers, 25% cache, model routing
# Logs under $OUT; the short tables last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEPS=/tmp/ft-fp8-deps
if ! python3 -c "import accelerate" 2>/dev/null; then
  ls .carry/wheels/accelerate-*.whl >/dev/null 2>&1 || { echo "prepare .carry/wheels first (see the top of $0)"; exit 2; }
  python3 -m pip install -q --no-deps --target "$DEPS" .carry/wheels/accelerate-*.whl > "$OUT/deps.log" 2>&1
fi
export PYTHONPATH=src:$DEPS
SUMMARY=$OUT/summary.md; : > "$SUMMARY"
for stage in ${*:-tests cpu gemm}; do case $stage in
tests)
  echo "== gpu-marked fp8 tests"
  timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_fp8_experts.py tests/test_fp8_checkpoint.py \
    > "$OUT/fp8_gpu_tests.log" 2>&1
  echo "fp8 GPU tests: $(tail -1 "$OUT/fp8_gpu_tests.log")" | tee -a "$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$OUT/fp8_gpu_tests.log" | head -10
  echo "== fp8 CPU kernel and checkpoint tests on this CPU"
  timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_kernel_fp8.py tests/test_fp8_refusals.py \
    > "$OUT/fp8_cpu_tests.log" 2>&1  # (test_quant_formats.py calls transformers 5.23 internals: CI runs it)
  echo "fp8 CPU tests: $(tail -1 "$OUT/fp8_cpu_tests.log")" | tee -a "$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$OUT/fp8_cpu_tests.log" | head -10 ;;
cpu)
  echo "== bench/cpu_fp8.py at 6 and 16 threads"
  timeout 260 python3 bench/cpu_fp8.py --threads 6,16 --iters 9 --pool-gib 2 --read-gib 4 \
    > "$OUT/cpu_fp8.md" 2> "$OUT/cpu_fp8.err" || echo "cpu_fp8 failed: $(tail -2 "$OUT/cpu_fp8.err")"
  { echo; cat "$OUT/cpu_fp8.md"; } >> "$SUMMARY" ;;
gemm)
  echo "== bench/gpu/fp8_gemm.py"
  timeout 150 python3 bench/gpu/fp8_gemm.py > "$OUT/fp8_gemm.md" 2> "$OUT/fp8_gemm.err" \
    || echo "fp8_gemm failed: $(tail -2 "$OUT/fp8_gemm.err")"
  { echo; cat "$OUT/fp8_gemm.md"; } >> "$SUMMARY" ;;
decode)
  ARGS="--layers 12 --expert-cache 0.25 --steps 128 --warmup-tokens 64 --cpu-threads 6,16 --repeats 1"
  for preset in qwen3-30b-a3b-fp8 qwen3-30b-a3b; do
    timeout 200 python3 -m freetoken.bench.decode --preset $preset $ARGS --policies fused,offload,hybrid \
      --json "$OUT/decode_$preset.json" > "$OUT/decode_$preset.md" 2> "$OUT/decode_$preset.err" \
      || echo "decode $preset failed: $(tail -2 "$OUT/decode_$preset.err")"
    { echo; echo "decode $preset:"; grep -E "^(policy|fused|offload|hybrid|#)" "$OUT/decode_$preset.md"; } >> "$SUMMARY"
  done ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
echo; echo "== summary"; cat "$SUMMARY"
