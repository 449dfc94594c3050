#!/usr/bin/env bash
# GPU box, twelfth session's second sitting (carry .carry). Stages, one device call each, back to back:
#   b1 (~7.5 min) overlap_check.sh check (the overlapped step's GPU tests; fused profile, batch 1 / 4, overlap on
#      and off); fused e2e batch 1 / 4 overlap on and off; the fp8 CPU kernel at 16 threads, this tree vs the one
#      before the fp8 unit change (.carry/fp8-old-src.tgz = git archive b4ae4cd src), alternating
#   b2 (~6 min) the elastic timeline for offload (back to 90% after the other process frees, after the regrow fix);
#      FTW: the FTW tests' full log, ft bench load (1 repeat; faulthandler in the children); the host-checkpoint, regrow
#      and Qwen3-Next fp32 GPU tests
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25"
for stage in "$@"; do case $stage in
b1)
  OUT=$OUT/overlap bash bench/gpu/overlap_check.sh check 2>&1 | tail -12
  for ov in overlap no-overlap; do
    timeout 75 $E2E --policies fused --batch 1,4 --repeats 1 --tokens 64 --warmup 8 --no-moe-only --$ov \
      > "$OUT/e2e_fused_$ov.log" 2> "$OUT/e2e_fused_$ov.err"
    grep "^|" "$OUT/e2e_fused_$ov.log" | tail -2 | sed "s/^/$ov /"; grep -iE "Traceback|Error" -A3 "$OUT/e2e_fused_$ov.err" | head -5
  done
  mkdir -p /tmp/oldfp8 && tar xzf .carry/fp8-old-src.tgz -C /tmp/oldfp8
  for src in src /tmp/oldfp8/src src; do
    PYTHONPATH=$src timeout 90 python3 bench/cpu_fp8.py --threads 16 --iters 4 --pool-gib 2 --read-gib 4 2>&1 \
      | grep "^| 16" | sed "s|^|$src |"
  done ;;
b2)
  export FREETOKEN_CACHE=/tmp/ftc PYTHONFAULTHANDLER=1  # the load child inherits it: a crash prints every thread
  OUT=$OUT/elastic BACKENDS=offload bash bench/gpu/elastic_check.sh timeline 2>&1 \
    | grep -E "back_to_90|first_shrink|other_had_all|PASS|FAIL|tok_s\"|same_tokens\"|Traceback|Error" | head -20
  rm -rf /tmp/ft-elastic-qwen3-*
  timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_ftw.py tests/test_ftw_refusals.py > "$OUT/ftw_tests.log" 2>&1
  echo "FTW tests: $(tail -1 "$OUT/ftw_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/ftw_tests.log" | head
  timeout 200 python3 -m freetoken.bench.ftw_load --preset qwen3-30b-a3b --layers 12 --repeats 1 \
    --moe-backend hybrid --expert-cache 0.25 --json "$OUT/ftw_load.json" > "$OUT/ftw_load.md" 2> "$OUT/ftw_load.err" \
    || tail -40 "$OUT/ftw_load.err"
  cat "$OUT/ftw_load.md"
  rm -rf /tmp/ftc/bench
  timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_host_checkpoints.py > "$OUT/hostckpt.log" 2>&1
  echo "host checkpoint GPU tests: $(tail -1 "$OUT/hostckpt.log")"
  timeout 40 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_elastic_memory.py -k regrown > "$OUT/regrow.log" 2>&1
  echo "regrow GPU test: $(tail -1 "$OUT/regrow.log")"
  timeout 45 python3 -m pytest -q -p no:cacheprovider -m gpu -x "tests/test_reference_hybrid.py::test_prefill_and_decode_logits_match" \
    -k "qwen3_next and fused" > "$OUT/qwen3_next.log" 2>&1
  echo "qwen3_next fused CUDA: $(tail -1 "$OUT/qwen3_next.log")"; grep -E "logits differ" "$OUT/qwen3_next.log" | head -3 ;;
*) echo "unknown stage $stage (b1, b2)"; exit 2 ;;
esac; done
