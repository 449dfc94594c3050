#!/usr/bin/env bash
# GPU box run for whole-layer double-buffered prefill (fits in ~3 minutes). Logs and JSON under $OUT.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "== GPU tests (prefill streamer)"; timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_prefill_stream.py > "$OUT/prefill_tests.log" 2>&1; tail -2 "$OUT/prefill_tests.log"
echo "== ft bench prefill"; timeout 140 python3 -m freetoken.bench.prefill --preset qwen3-30b-a3b --layers 12 \
  --tokens 4096,8192,16384 --chunk 8192 --modes stream,serial,ondemand --repeats 2 --json "$OUT/prefill.json" \
  > "$OUT/prefill.log" 2> "$OUT/prefill.err"; cat "$OUT/prefill.log"; tail -3 "$OUT/prefill.err"
