#!/usr/bin/env bash
# GPU box, the next session's sitting (prepared 2026-12-01, twelfth session, when the device was no longer lent).
# Carry [".carry"] (lcpp-src.tgz, pylib with fla-core/einops/llguidance/xxhash/nvidia-ml-py/accelerate, traces,
# wheels with opentelemetry-api, old-src.tgz, fp8-old-src.tgz, hyb-old-src.tgz). Stages, one device call each, back to back; every log
# whole under $OUT:
#   t     (~8 min) every GPU test the twelfth session's changes touch, in one pytest run: the overlapped step
#         (test_overlap_gpu, test_step_graph_gpu), fla (test_fla_gpu/dispatch), the hybrid families' fp32 logits on
#         CUDA (re-seeded: float32 noise <= 0.25 of the tolerance), host-RAM checkpoints, the regrown slot cache, the
#         CPU-step session's shared functions (norm, paged attention, backends, reference models, layer graphs, fp8),
#         FTW, the one-call CPU branch queue, the step kernels
#   b2    (~6 min) sitting5.sh b2's benchmarks: the elastic offload timeline (back to 90% after the regrow fix) and
#         ft bench load (FTW vs safetensors vs the raw read; the load child aborted at exit in the twelfth session)
#   fla   (~5 min) fla_check.sh e2e: --preset qwen3.6-35b-a3b decode e2e / MoE-only with and without fla, 8k prefill
#   hyb   (~5 min) hybrid 6 / 16 threads batch 1 e2e / MoE-only on the trace (was 0.84 at 16; the step's CPU batches now
#         queue in one call; its host reads the step sleeping), this tree vs cc0be7e alternating; sampled; fused overlap profile with --host-ops once (where the last 17% goes)
#   train (~9 min) bench/gpu/train_v2.sh, the embedded model v2 (issue 25), if it has landed
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25"
for stage in "$@"; do case $stage in
t)
  timeout 500 python3 -m pytest -q -p no:cacheprovider -rs -m "gpu or not gpu" tests/test_overlap_gpu.py \
    tests/test_step_graph_gpu.py tests/test_fla_gpu.py tests/test_fla_dispatch.py tests/test_host_checkpoints.py \
    tests/test_norm.py tests/test_paged_attention.py tests/test_backends.py tests/test_layer_graphs_gpu.py \
    tests/test_fp8_experts.py tests/test_ftw.py tests/test_ftw_refusals.py tests/test_cpu_kernel_queue.py \
    tests/test_step_kernels.py tests/test_reference_hybrid.py tests/test_reference_models.py \
    "tests/test_elastic_memory.py::test_a_regrown_offload_cache_is_warm_and_exact" > "$OUT/gpu_tests.log" 2>&1
  echo "GPU tests: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -30 ;;
b2)
  export PYTHONFAULTHANDLER=1  # a crashing load child prints every thread
  OUT=$OUT/elastic BACKENDS=offload bash bench/gpu/elastic_check.sh timeline 2>&1 \
    | grep -E "back_to_90|first_shrink|other_had_all|PASS|FAIL|tok_s\"|same_tokens\"|Traceback|Error" | head -20
  rm -rf /tmp/ft-elastic-qwen3-*
  timeout 260 python3 -m freetoken.bench.ftw_load --preset qwen3-30b-a3b --layers 12 --repeats 2 \
    --moe-backend hybrid --expert-cache 0.25 --json "$OUT/ftw_load.json" > "$OUT/ftw_load.md" 2> "$OUT/ftw_load.err" \
    || tail -60 "$OUT/ftw_load.err"
  cat "$OUT/ftw_load.md"; rm -rf /tmp/ftc/bench ;;
fla)
  OUT=$OUT/fla bash bench/gpu/fla_check.sh e2e 2>&1 | tail -20; rm -rf /tmp/ft-e2e-qwen36-12 ;;
hyb)
  # A/B: this tree vs cc0be7e (.carry/hyb-old-src.tgz: before the blocking-sync read of hybrid steps), alternating
  mkdir -p /tmp/hybold && tar xzf .carry/hyb-old-src.tgz -C /tmp/hybold
  i=0; for src in src /tmp/hybold/src src; do i=$((i+1))
    PYTHONPATH=$src:.carry/pylib timeout 100 $E2E --policies hybrid --cpu-threads 6,16 --batch 1 --repeats 2 \
      --routing-trace .carry/traces/locality-48x128x8.npy > "$OUT/hyb_trace$i.log" 2> "$OUT/hyb_trace$i.err"
    grep "^| [0-9]" "$OUT/hyb_trace$i.log" | sed "s|^|$src |"
  done
  timeout 100 $E2E --policies hybrid --cpu-threads 6,16 --batch 1 --repeats 2 --temperature 1.0 \
    --json "$OUT/hyb_sampled.json" > "$OUT/hyb_sampled.log" 2> "$OUT/hyb_sampled.err"; grep "^|" "$OUT/hyb_sampled.log" | tail -3
  timeout 60 python3 bench/gpu/e2e_profile.py $CK --backend fused --overlap --host-ops --top 30 > "$OUT/profile_host.txt" 2>&1
  tail -32 "$OUT/profile_host.txt" ;;
train)
  if [ -f bench/gpu/train_v2.sh ]; then bash bench/gpu/train_v2.sh 2>&1 | tail -30; else echo "no train_v2.sh"; fi ;;
*) echo "unknown stage $stage (t, b2, fla, hyb, train)"; exit 2 ;;
esac; done
