#!/usr/bin/env bash
# Issue 19, fewer kernels per fused decode step (branch kernels19), one device call of ≤ 5 minutes:
#   1. the GPU tests of what changed: the paged decode kernel with its merge in the same launch (tickets, many
#      splits, graph replays through the step graph), the grouped expert GEMM's combine launch (bf16 and fp8
#      banks, every backend), the step kernels, the layer and step graphs, the reference models on CUDA;
#   2. the 12-layer qwen3-30b-a3b checkpoint (written by the first e2e run; 15.2 GB under /tmp, ~25 s), then for this
#      tree and for main's tree (`.carry/k19-main-src.tgz`) alternating: `bench/gpu/e2e_profile.py` at batch 1 and 4
#      (kernels per step, GPU busy, the kernels of most launches) and `ft bench e2e` fused b1/b4 tok/s;
#   3. a short table last.
# Make the tarball here first (main's src, what the comparison is against):
#   git -C /work/main archive --format=tar.gz -o "$PWD/.carry/k19-main-src.tgz" HEAD src
# Run (carry [".carry/k19-main-src.tgz"]): bash bench/gpu/kernels_check.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 FREETOKEN_CACHE=/tmp/ftc
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CK=/tmp/ft-e2e-qwen3-12
MAIN=.carry/k19-main-src.tgz
E2E="python3 -m freetoken.bench.e2e --preset qwen3-30b-a3b --layers 12 --dir $CK --expert-cache 0.25"

PYTHONPATH=src timeout 100 python3 -m pytest -q -p no:cacheprovider -rs -m gpu tests/test_paged_attention.py \
  tests/test_step_kernels.py tests/test_backends.py tests/test_fp8_experts.py tests/test_step_graph_gpu.py \
  tests/test_layer_graphs_gpu.py tests/test_reference_models.py tests/test_norm.py > "$OUT/gpu_tests.log" 2>&1
echo "GPU tests: $(tail -1 "$OUT/gpu_tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -20

trees=(src)
if [ -f "$MAIN" ]; then mkdir -p /tmp/k19main && tar xzf "$MAIN" -C /tmp/k19main && trees=(src /tmp/k19main/src)
else echo "no $MAIN: this tree only"; fi
for src in "${trees[@]}"; do
  tag=$([ "$src" = src ] && echo tree || echo main)
  lim=$([ "$tag" = tree ] && echo 80 || echo 60)  # the first run writes the checkpoint (~25 s)
  PYTHONPATH=$src timeout $lim $E2E --policies fused --batch 1,4 --repeats 1 --tokens 64 --warmup 8 --no-moe-only \
    > "$OUT/e2e_$tag.log" 2> "$OUT/e2e_$tag.err" || tail -20 "$OUT/e2e_$tag.err"
  for b in 1 4; do
    PYTHONPATH=$src timeout 30 python3 bench/gpu/e2e_profile.py $CK --backend fused --batch $b --top 30 \
      > "$OUT/profile_${tag}_b$b.txt" 2>&1 || tail -20 "$OUT/profile_${tag}_b$b.txt"
  done
done

echo; echo "| tree | batch | kernels/step | GPU busy | ms/step (profiled) | e2e fused tok/s |"; echo "|---|---|---|---|---|---|"
for tag in tree main; do
  [ -f "$OUT/e2e_$tag.log" ] || continue
  for b in 1 4; do
    line=$(grep "kernels/step" "$OUT/profile_${tag}_b$b.txt" | tail -1)
    ks=$(sed -E 's/.* ([0-9]+) kernels\/step.*/\1/' <<< "$line")
    busy=$(sed -E 's/.*GPU busy ([0-9.]+%).*/\1/' <<< "$line")
    ms=$(sed -E 's/.*: ([0-9.]+) ms\/step.*/\1/' <<< "$line")
    tok=$(awk -F'|' -v b=$b '$3 ~ /fused/ && $4+0 == b {gsub(/ /, "", $5); print $5}' "$OUT/e2e_$tag.log" | head -1)
    echo "| $tag | $b | $ks | $busy | $ms | ${tok:-see e2e_$tag.log} |"
  done
done
echo; echo "e2e tables:"; for tag in tree main; do [ -f "$OUT/e2e_$tag.log" ] && grep "^|" "$OUT/e2e_$tag.log" | sed "s/^/$tag /"; done
