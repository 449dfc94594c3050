#!/usr/bin/env bash
# GPU box check of issue 23's fast start (FTW), one device call, ~4 min.
#
# Prepare .carry/ once, on the dev machine, from the repository root (.carry/ is git-ignored): the box has no
# xxhash (FTW's checksums):
#   mkdir -p .carry/wheels && for v in 3.10 3.11 3.12 3.13; do pip download "xxhash>=3" --no-deps \
#     --only-binary=:all: --platform manylinux_2_17_x86_64 --python-version $v -d .carry/wheels; done
# and name it in the run's carry: [".carry/wheels"]  (about 2 MB).
#
# Stages (default: both):
#   tests (~30 s) tests/test_ftw.py and tests/test_ftw_refusals.py: the CPU ones on this box's filesystem (its
#         O_DIRECT), and the gpu-marked one (the FTW pool pinned in place by cudaHostRegister, greedy tokens on CUDA
#         equal the original checkpoint's, bf16 and fp8)
#   load  (~3.5 min) ft bench load on the 12-layer qwen3-30b-a3b synthetic checkpoint (about 15 GB, written to
#         $FREETOKEN_CACHE/bench/qwen3-30b-a3b-12layers when absent, its FTW form beside it): time to the first token
#         of a fresh process, safetensors vs FTW, beside the raw O_DIRECT read of the FTW files in the same run,
#         page cache dropped before each; peak RSS against pool + non-expert; 16 greedy tokens compared.
#         Targets: FTW load <= 1.2x the raw read; peak RSS <= 1.05x pool + non-expert. REPEATS=2 by default.
# Logs under $OUT; the short table last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
DEPS=/tmp/ft-ftw-deps
if ! python3 -c "import xxhash" 2>/dev/null; then
  ls .carry/wheels/xxhash-*.whl >/dev/null 2>&1 || { echo "prepare .carry/wheels first (see the top of $0)"; exit 2; }
  python3 -m pip install -q --no-deps --no-index --find-links .carry/wheels --target "$DEPS" xxhash \
    > "$OUT/deps.log" 2>&1 || { echo "xxhash install failed: $(tail -2 "$OUT/deps.log")"; exit 2; }
fi
export PYTHONPATH=src:$DEPS
SUMMARY=$OUT/summary.md; : > "$SUMMARY"
for stage in ${*:-tests load}; do case $stage in
tests)
  echo "== FTW tests (CPU ones and the gpu-marked one)"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_ftw.py tests/test_ftw_refusals.py \
    > "$OUT/ftw_tests.log" 2>&1
  echo "FTW tests: $(tail -1 "$OUT/ftw_tests.log")" | tee -a "$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$OUT/ftw_tests.log" | head -10 ;;
load)
  echo "== ft bench load, qwen3-30b-a3b, 12 layers"
  df -h "${FREETOKEN_CACHE:-$HOME/.cache}" | tail -1 > "$OUT/disk.txt"
  timeout 400 python3 -m freetoken.bench.ftw_load --preset qwen3-30b-a3b --layers 12 --repeats "${REPEATS:-2}" \
    --moe-backend hybrid --expert-cache 0.25 \
    --json "$OUT/ftw_load.json" > "$OUT/ftw_load.md" 2> "$OUT/ftw_load.err" \
    || echo "ftw_load failed: $(tail -3 "$OUT/ftw_load.err")"
  { echo; cat "$OUT/disk.txt"; cat "$OUT/ftw_load.md"; } >> "$SUMMARY" ;;
*) echo "unknown stage $stage (tests, load)"; exit 2 ;;
esac; done
echo; cat "$SUMMARY"
