#!/usr/bin/env bash
# GPU box check of the state checkpoints' host-RAM tier (issue 21 follow-up), one device call, ~1.5 min.
#
# Nothing to prepare. Stages (default: both):
#   tests (~1 min) tests/test_host_checkpoints.py with its gpu-marked tests (a checkpoint through pinned memory and
#         back is bit-equal with the device slot rewritten right after the save; the edited prompt resumed from a
#         pinned host checkpoint gives the logits it gets from a device checkpoint, fp32) and the CPU ones, and
#         tests/test_state_checkpoints.py on the box
#   copy  (~20 s) bench/gpu/hostckpt_copy.py: save / load ms and GB/s of one Qwen3.6-35B-A3B-sized checkpoint
#         (61.4 MiB) and whether saves queued beside compute delay it
# ft bench agent-edits needs uvicorn (not on the box): its host-tier figures are the dev box's (docs/benchmarks.md).
# Logs under $OUT; the short table last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SUMMARY=$OUT/summary.md; : > "$SUMMARY"
for stage in ${*:-tests copy}; do case $stage in
tests)
  echo "== tests/test_host_checkpoints.py (gpu-marked too), tests/test_state_checkpoints.py"
  timeout 180 python3 -m pytest -q -p no:cacheprovider -rs tests/test_host_checkpoints.py tests/test_state_checkpoints.py \
    > "$OUT/hostckpt_tests.log" 2>&1
  echo "host tier tests: $(tail -1 "$OUT/hostckpt_tests.log")" | tee -a "$SUMMARY"
  grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/hostckpt_tests.log" | head -10 | tee -a "$SUMMARY" ;;
copy)
  echo "== host tier copies at Qwen3.6-35B-A3B's checkpoint size"
  timeout 90 python3 bench/gpu/hostckpt_copy.py > "$OUT/hostckpt_copy.log" 2>&1
  tee -a "$SUMMARY" < "$OUT/hostckpt_copy.log" ;;
*) echo "unknown stage $stage (tests, copy)"; exit 2 ;;
esac; done
echo; echo "== summary"; cat "$SUMMARY"
