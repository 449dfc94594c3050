#!/usr/bin/env bash
# GPU box, one short call (the last ~3 minutes of device time): the GPU tests of the kernels merged untested —
# issue 19's fewer-kernels step (decode attention with norm+rope+KV write, router, grouped gate_up, down with the
# weighted sum, embedding+RMSNorm) and issue 21's fused DeltaNet step — then the graphed step and the engine's greedy
# tokens on CUDA; fla at small head dims beside them. Carry [".carry/pylib"]. Logs under $OUT as each part ends.
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
P="python3 -m pytest -q -p no:cacheprovider -rs -m gpu"
(timeout 100 python3 bench/gpu/fla_dims.py > "$OUT/fla_dims.log" 2>&1 &)
timeout 70 $P tests/test_step_kernels.py tests/test_paged_attention.py tests/test_norm.py > "$OUT/k19_tests.log" 2>&1
echo "k19 kernels: $(tail -1 "$OUT/k19_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/k19_tests.log" | head -12
timeout 35 $P tests/test_deltanet_step.py > "$OUT/dn_tests.log" 2>&1
echo "deltanet step: $(tail -1 "$OUT/dn_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/dn_tests.log" | head -8
timeout 60 $P tests/test_step_graph_gpu.py "tests/test_backends.py::test_engine_greedy_tokens_match" \
  > "$OUT/step_tests.log" 2>&1
echo "graphed step + greedy: $(tail -1 "$OUT/step_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/step_tests.log" | head -8
grep "^dk" "$OUT/fla_dims.log"
