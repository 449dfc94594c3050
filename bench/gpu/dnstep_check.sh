#!/usr/bin/env bash
# GPU box check of the fused gated DeltaNet decode step (issue 21: layers/deltanet_triton.py, the gated norm in
# layers/norm_triton.py): one call, <= 5 device minutes.
#
# Carry .carry/pylib (fla-core 0.6.0 + einops unpacked, as bench/gpu/fla_check.sh's top says): prefill keeps fla.
# Stages (default: all, in this order):
#   tests (~2 min) tests/test_deltanet_step.py on CUDA (the step kernel and the gated norm vs their torch references,
#         bf16 and fp32, GVA, dv blocks, fresh + padded rows; Qwen3.6's layer shape replayed from a captured graph;
#         the layer's decode through the kernel), tests/test_fla_gpu.py (fla's chunked kernel; tiny hybrids in bf16,
#         fla vs the torch prefill, decode through the new kernel either way), the CUDA cases of
#         tests/test_reference_hybrid.py (fp32 vs transformers, decode from step graphs: the new kernel in fp32)
#   time  (~20 s) bench/gpu/dnstep_time.py: one DeltaNet layer's graphed decode forward, fused vs torch ops, and the
#         step kernel per dv block, Qwen3.6 shape, batch 1 and 4
#   e2e   (~2.5 min; writes the 12-layer checkpoint the first time, ~19 GB) ft bench e2e --preset qwen3.6-35b-a3b
#         --layers 12, cache 0.25, 16 CPU threads, fused and hybrid at batch 1 and 4: decode e2e vs MoE-only
#         (target >= 0.9; before: 0.57-0.73, fused b1 322 tok/s, docs/benchmarks.md)
# Logs whole under $OUT; the short table last.
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
echo "commit $(git rev-parse --short HEAD 2>/dev/null), torch $(python3 -c 'import torch; print(torch.__version__)'), triton $(python3 -c 'import triton; print(triton.__version__)'), fla $(python3 -c 'import fla; print(fla.__version__)' 2>&1 | tail -1)"
for stage in ${*:-tests time e2e}; do case $stage in
tests)
  timeout 60 python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_deltanet_step.py > "$OUT/dnstep_tests.log" 2>&1
  echo "deltanet step kernels on CUDA: $(tail -1 "$OUT/dnstep_tests.log")"
  grep -E "^(FAILED|ERROR)|relative l2|Mismatched|Greatest" "$OUT/dnstep_tests.log" | head -20
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_fla_gpu.py > "$OUT/fla_tests.log" 2>&1
  echo "fla tests: $(tail -1 "$OUT/fla_tests.log")"; grep -E "^(FAILED|ERROR)|relative l2|near tie" "$OUT/fla_tests.log" | head -20
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_reference_hybrid.py > "$OUT/hybrid_tests.log" 2>&1
  echo "hybrid reference tests on CUDA (fp32): $(tail -1 "$OUT/hybrid_tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/hybrid_tests.log" | head -10 ;;
time)
  FREETOKEN_FLA=0 timeout 60 python3 bench/gpu/dnstep_time.py > "$OUT/dnstep_time.log" 2>&1; echo "dnstep_time: rc $?"
  grep -iE "Traceback|Error" "$OUT/dnstep_time.log" | head -5 ;;
e2e)
  timeout 240 python3 -m freetoken.bench.e2e --preset qwen3.6-35b-a3b --layers 12 --dir /tmp/ft-e2e-qwen36-12 \
    --expert-cache 0.25 --cpu-threads 16 --policies fused,hybrid --batch 1,4 --repeats 3 --json "$OUT/e2e.json" \
    > "$OUT/e2e.log" 2> "$OUT/e2e.err"
  echo "e2e decode: rc $?"; grep -iE "Traceback|Error" "$OUT/e2e.err" | head -5 ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
echo; echo "== summary"
cat "$OUT/dnstep_time.log" 2>/dev/null | grep "^|"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
p = pathlib.Path(sys.argv[1]) / "e2e.json"
if p.exists():
    print("\n| policy | batch | e2e tok/s | MoE-only tok/s | e2e / MoE-only (target >= 0.9) | graph replays |")
    print("|---|---|---|---|---|---|")
    for r in json.loads(p.read_text())["rows"]:
        ratio = r["e2e_tok_s"] / r["moe_tok_s"] if r["moe_tok_s"] else 0
        print(f"| {r['policy']} | {r['batch']} | {r['e2e_tok_s']:.1f} | {r['moe_tok_s'] or 0:.1f} | {ratio:.2f} "
              f"| {r['step_graph_replays']} |")
PY
