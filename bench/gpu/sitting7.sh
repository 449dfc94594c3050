#!/usr/bin/env bash
# GPU box, the sitting after the thirteenth session (prepared 2026-12-01). Carry per stage (the tree is ~27 MB and
# all of .carry ~40 MB: together near the 64 MiB limit): t, train, q36: [".carry/pylib"] (fla-core, einops,
# llguidance, xxhash, nvidia-ml-py, accelerate); k19: [".carry/pylib", ".carry/k19-main-src.tgz"]; b2: [".carry/pylib"];
# hyb: [".carry/pylib", ".carry/traces", ".carry/hyb-old-src.tgz"].
# Stages, one device call each, back to back, in this order of value; every log whole under $OUT:
#   t      (~6 min) what the thirteenth session's sitting failed on, fixed since: the hybrid oracle on CPU and CUDA
#          with fla on the path, the refused host registration (test_host_pool_gpu, static-freq), fla at head dim
#          16 (fla_dims.py: is fla wrong below some head dim? the model-level fla test's cause); then the fused
#          DeltaNet decode step's tests and per-layer timing (dnstep_check.sh tests time)
#   train  (~10 min) bench/gpu/train_v2.sh: v2 with fla's gradient check inside train.py (issue 25)
#   q36    (~6 min) Qwen3.6 decode e2e / MoE-only with the fused DeltaNet step (dnstep_check.sh e2e; was 0.57-0.73,
#          target 0.9), then where its step's time goes: e2e_profile fused and hybrid, batch 1 (issue 21)
#   k19    (~5 min) bench/gpu/kernels_check.sh, if the fewer-kernels branch has landed (issue 19)
#   b2     (~6 min) sitting6.sh b2: the elastic offload timeline, ft bench load (issue 23)
#   hyb    (~5 min) sitting6.sh hyb: the hybrid step's blocking read A/B, sampled rows, fused profile (issue 19)
set -uo pipefail
export PYTHONPATH=src:.carry/pylib PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
Q36=/tmp/ft-e2e-qwen36-12
for stage in "$@"; do case $stage in
t)
  timeout 150 python3 bench/gpu/fla_dims.py > "$OUT/fla_dims.log" 2>&1; grep "^dk" "$OUT/fla_dims.log"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -m "gpu or not gpu" tests/test_host_pool_gpu.py \
    "tests/test_backends.py::test_engine_greedy_tokens_match" "tests/test_reference_hybrid.py::test_prefill_and_decode_logits_match" \
    > "$OUT/gpu_tests.log" 2>&1
  echo "GPU tests: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)|relative l2" "$OUT/gpu_tests.log" | head -30
  OUT=$OUT/dn bash bench/gpu/dnstep_check.sh tests time 2>&1 | tail -30 ;;
train)
  bash bench/gpu/train_v2.sh 2>&1 | tail -30 ;;
q36)
  OUT=$OUT/dn bash bench/gpu/dnstep_check.sh e2e 2>&1 | tail -12  # writes $Q36 (the same --dir)
  for b in fused hybrid; do
    cache=""; [ $b = hybrid ] && cache="--expert-cache 0.25"
    timeout 90 python3 bench/gpu/e2e_profile.py $Q36 --backend $b $cache --top 40 > "$OUT/q36_profile_$b.txt" 2>&1
    echo "== $b"; tail -44 "$OUT/q36_profile_$b.txt"
  done
  rm -rf $Q36 ;;
k19)
  if [ -f bench/gpu/kernels_check.sh ]; then OUT=$OUT/k19 bash bench/gpu/kernels_check.sh 2>&1 | tail -30
  else echo "no kernels_check.sh"; fi ;;
b2|hyb)
  OUT=$OUT bash bench/gpu/sitting6.sh $stage ;;
*) echo "unknown stage $stage (t, train, q36, k19, b2, hyb)"; exit 2 ;;
esac; done
