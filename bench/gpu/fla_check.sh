#!/usr/bin/env bash
# GPU box check of issue 21's fla path: flash-linear-attention's gated delta rule kernels (fla-core) as the GPU path
# of the gated DeltaNet layers (layers/gated_delta_fla.py). ~6 device minutes in all; one call per stage is safest.
#
# Carry .carry/pylib: fla-core 0.6.0 and einops 0.8.2 unpacked (pure Python wheels; the box cannot pip install):
#   pip download fla-core==0.6.0 einops==0.8.2 --no-deps -d /tmp/w && for w in /tmp/w/*.whl; do
#     unzip -q -o "$w" -d .carry/pylib; done
# (fla-core 0.6.0 asks for torch >= 2.7, triton >= 3.3: the box's torch 2.11 / triton 3.6; packaging, which it
# imports, comes with transformers.)
# Stages (default: both, in this order):
#   tests (~2 min) tests/test_fla_gpu.py (chunked prefill one sequence and varlen from given states,
#         vs the fp32 torch reference on the same bf16 inputs at the fast-step
#         issue's bf16 tolerance; tiny Qwen3-Next / Qwen3.5-MoE in bf16 through fused and hybrid, fla vs the torch
#         path: greedy tokens under the near-tie rule), tests/test_fla_dispatch.py, the CUDA cases of
#         tests/test_reference_hybrid.py (fp32: the torch path, fla not chosen for float32 models)
#   e2e   (~4 min) ft bench e2e --preset qwen3.6-35b-a3b --layers 12 (9 gated DeltaNet : 3 gated attention, the real
#         3 : 1 ratio; written once to /tmp, ~19 GB), cache 0.25, 16 CPU threads: hybrid and fused decode at batch 1
#         and 4 (e2e vs MoE-only), then hybrid's 8k prefill row (TTFT cold vs the PCIe bound); once with fla, once
#         with FREETOKEN_FLA=0 (our torch ops on CUDA)
# Targets (issue 21): decode e2e >= 0.9x MoE-only; 8k prefill cold <= 1.3x the PCIe bound.
# Logs under $OUT; the short table last.
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen36-12
E2E="python3 -m freetoken.bench.e2e --preset qwen3.6-35b-a3b --layers 12 --dir $CK --expert-cache 0.25 --cpu-threads 16"
python3 -c "import fla.ops.gated_delta_rule" > "$OUT/fla_import.log" 2>&1 \
  || { echo "fla-core does not import: $(tail -1 "$OUT/fla_import.log") (carry .carry/pylib)"; exit 2; }
echo "fla-core $(python3 -c 'import fla; print(fla.__version__)'), torch $(python3 -c 'import torch; print(torch.__version__)'), triton $(python3 -c 'import triton; print(triton.__version__)')"
for stage in ${*:-tests e2e}; do case $stage in
tests)
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_fla_gpu.py tests/test_fla_dispatch.py \
    > "$OUT/fla_tests.log" 2>&1
  echo "fla tests: $(tail -1 "$OUT/fla_tests.log")"; grep -E "^(FAILED|ERROR)|relative l2|near tie" "$OUT/fla_tests.log" | head -20
  timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_reference_hybrid.py > "$OUT/hybrid_tests.log" 2>&1
  echo "hybrid reference tests on CUDA (fp32): $(tail -1 "$OUT/hybrid_tests.log")"
  grep -E "^(FAILED|ERROR)" "$OUT/hybrid_tests.log" | head -10 ;;
e2e)
  [ -f $CK/model.safetensors.index.json ] || { $E2E --policies fused --batch 1 --tokens 8 --repeats 1 --no-moe-only \
    > "$OUT/write.log" 2>&1; grep "# wrote" "$OUT/write.log"; }
  for mode in fla torch; do
    flag=1; [ $mode = torch ] && flag=0
    FREETOKEN_FLA=$flag timeout 200 $E2E --policies hybrid,fused --batch 1,4 --repeats 3 \
      --json "$OUT/e2e_$mode.json" > "$OUT/e2e_$mode.log" 2> "$OUT/e2e_$mode.err"
    echo "e2e decode $mode: rc $?"; grep -iE "Traceback|Error" "$OUT/e2e_$mode.err" | head -5
    FREETOKEN_FLA=$flag timeout 120 $E2E --policies hybrid --no-decode --prefill 8192 --repeats 2 \
      --json "$OUT/e2e_${mode}_prefill.json" > "$OUT/e2e_${mode}_prefill.log" 2> "$OUT/e2e_${mode}_prefill.err"
    echo "e2e prefill $mode: rc $?"; grep -iE "Traceback|Error" "$OUT/e2e_${mode}_prefill.err" | head -5
  done ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
echo; echo "== summary (decode: e2e / MoE-only, target >= 0.9; prefill 8192: cold / PCIe bound, target <= 1.3)"
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
print("| DeltaNet kernels | policy | batch | e2e tok/s | MoE-only tok/s | e2e / MoE-only | graph replays |")
print("|---|---|---|---|---|---|---|")
def read(name):
    p = out / name
    return json.loads(p.read_text()) if p.exists() else {"rows": [], "ttft": []}
runs = {m: read(f"e2e_{m}.json") for m in ("fla", "torch")}
prefill = {m: read(f"e2e_{m}_prefill.json") for m in ("fla", "torch")}
for m, d in runs.items():
    for r in d["rows"]:
        ratio = r["e2e_tok_s"] / r["moe_tok_s"] if r["moe_tok_s"] else 0
        print(f"| {m} | {r['policy']} | {r['batch']} | {r['e2e_tok_s']:.1f} | {r['moe_tok_s'] or 0:.1f} | {ratio:.2f} "
              f"| {r['step_graph_replays']} |")
print("\n| DeltaNet kernels | policy | prompt | TTFT cold s | PCIe bound s | cold / bound | TTFT warm s |")
print("|---|---|---|---|---|---|---|")
for m, d in prefill.items():
    for r in d["ttft"]:
        bound = r["pool_bytes"] / (r["b_p_gbps"] * 1e9) if r["b_p_gbps"] else 0
        print(f"| {m} | {r['policy']} | {r['tokens']} | {r['cold_s']:.3f} | {bound:.3f} "
              f"| {r['cold_s'] / bound if bound else 0:.2f} | {r['warm_s']:.3f} |")
PY
