#!/usr/bin/env bash
# GPU box check of issue 21 (hybrid families: gated DeltaNet + gated attention), one device call, ~2 min.
#
# Nothing to prepare. fla-core (flash-linear-attention) is not installed on the box: the DeltaNet layers run our
# torch reference (layers/gated_delta.py) on CUDA, inside the whole-step CUDA graph for decode.
# Stages (default: both):
#   tests (~1.5 min) every test of tests/test_reference_hybrid.py on CUDA and the CPU (fp32: prefill logits one shot
#         and chunked, token-by-token decode logits, greedy tokens of a batch of three lengths through fused, offload
#         and hybrid, decode replayed from step graphs), the engine-failure tests (a hybrid model's retry recomputes)
#   graph (~20 s) the same greedy batch with and without step graphs, the replay count (graphed == eager)
# The box's transformers must have qwen3_next and qwen3_5_moe (the tests' oracle); the script says so if not.
# Logs under $OUT; the short table last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=src
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SUMMARY=$OUT/summary.md; : > "$SUMMARY"
python3 -c "import transformers.models.qwen3_next, transformers.models.qwen3_5_moe" 2>/dev/null \
  || { echo "this transformers ($(python3 -c 'import transformers; print(transformers.__version__)')) lacks qwen3_next or qwen3_5_moe" | tee -a "$SUMMARY"; exit 2; }
for stage in ${*:-tests graph}; do case $stage in
tests)
  echo "== tests/test_reference_hybrid.py (CUDA and CPU), tests/test_engine_failures.py"
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_reference_hybrid.py tests/test_state_checkpoints.py \
    tests/test_engine_failures.py \
    > "$OUT/hybrid_tests.log" 2>&1
  echo "hybrid tests: $(tail -1 "$OUT/hybrid_tests.log")" | tee -a "$SUMMARY"
  grep -E "^(FAILED|ERROR)" "$OUT/hybrid_tests.log" | head -10 ;;
graph)
  echo "== graphed == eager on a tiny Qwen3.5-MoE"
  timeout 120 python3 - > "$OUT/hybrid_graph.log" 2>&1 <<'PY'
import sys, tempfile, time, pathlib, torch
sys.path.insert(0, "tests")
from tiny_models import save_checkpoint
from freetoken import LLM, SamplingParams
d = pathlib.Path(tempfile.mkdtemp()); save_checkpoint("qwen3_5_moe", d, seed=2)
g = torch.Generator().manual_seed(7)
prompts = [torch.randint(3, 512, (n,), generator=g).tolist() for n in (1, 9, 30, 70)]
p = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
out = {}
for graphs in (True, False):
    llm = LLM(model=str(d), device="cuda", dtype="float32", cuda_graphs=graphs)
    t = time.perf_counter(); res = llm.generate(prompts, p); dt = time.perf_counter() - t
    out[graphs] = [r.token_ids for r in res]
    print(f"cuda_graphs={graphs}: {dt:.2f} s, replays {llm.stats().get('step_graph_replays', 0)}")
print("graphed == eager:", out[True] == out[False])
PY
  { echo; cat "$OUT/hybrid_graph.log" | tail -4; } | tee -a "$SUMMARY" ;;
*) echo "unknown stage $stage"; exit 2 ;;
esac; done
echo; echo "== summary"; cat "$SUMMARY"
