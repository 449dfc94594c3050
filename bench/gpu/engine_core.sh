#!/usr/bin/env bash
# GPU box check for the engine core: reference tests on CUDA (fp32 identical tokens, bf16 agreement).
# Usage on the device: bash bench/gpu/engine_core.sh   (writes logs under $OUT)
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 -m pytest -q -p no:cacheprovider -rA tests/test_reference_models.py tests/test_scheduler.py \
  tests/test_async_llm.py -s 2>&1 | tee "$OUT/engine_core.log" | grep -E "bf16|passed|failed|PASSED|FAILED|ERROR|Error" | tail -60
