#!/usr/bin/env bash
# GPU box: the CPU-step branch changed shared functions whose CUDA behaviour must stay identical
# (experts/reference.expert_ffn and fused._gathered widen weights of another dtype — a no-op for CUDA's own;
# layers/norm, moe.route, attention, mlp, decoder.logits take their CPU ops only for CPU float32 tensors).
# One device call (~4 min): the GPU tests of those paths. Run: bash bench/gpu/cpustep_check.sh
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 280 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_norm.py tests/test_paged_attention.py \
  tests/test_backends.py tests/test_reference_models.py tests/test_step_graph_gpu.py tests/test_layer_graphs_gpu.py \
  tests/test_fp8_experts.py -k "not past_the_buckets" > "$OUT/cpustep_gpu_tests.log" 2>&1
tail -1 "$OUT/cpustep_gpu_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/cpustep_gpu_tests.log" | head -20
